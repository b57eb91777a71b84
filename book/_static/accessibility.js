// Accessibility work-arounds for the book's pages, in the browser (listed in _config.yml).
//
// 1. Every box that scrolls sideways can be scrolled with the keyboard: it takes focus
//    (tabindex="0") while its content is wider than it is, and leaves the tab order when it is
//    not. The theme does this for code blocks and Markdown tables when the page loads and, 300 ms
//    after the window is resized, but not for boxes that change size later: a solution's code when
//    its dropdown opens, a cell output or a table after the page narrows. A ResizeObserver catches
//    every such change as it happens.
// 2. Every part of the page sits in a landmark: the left sidebar (the book's title, search and
//    table of contents) is marked as the book's navigation, so a screen reader can jump to it
//    and skip it, as it does the theme's own navigation landmarks.
(function () {
  "use strict";

  var SCROLL_BOXES = [
    "article div.highlight > pre",
    "article div.cell_output",
    "article div.cell_output > .output",
    "article .mha-table",
    "article .pst-scrollable-table-container",
  ].join(", ");

  function scrollable(overflow) {
    return overflow === "auto" || overflow === "scroll";
  }

  function updateTabStop(box) {
    var style = window.getComputedStyle(box);
    var scrolls =
      (scrollable(style.overflowX) && box.scrollWidth > box.clientWidth + 1) ||
      (scrollable(style.overflowY) && box.scrollHeight > box.clientHeight + 1);
    if (scrolls && box.tabIndex !== 0) {
      box.tabIndex = 0;
    } else if (!scrolls && box.hasAttribute("tabindex") && box.tabIndex === 0) {
      box.tabIndex = -1;
    }
  }

  function watchScrollBoxes() {
    var boxes = document.querySelectorAll(SCROLL_BOXES);
    if (!("ResizeObserver" in window)) {
      boxes.forEach(updateTabStop);
      return;
    }
    var observer = new ResizeObserver(function (entries) {
      entries.forEach(function (entry) {
        updateTabStop(entry.target);
      });
    });
    boxes.forEach(function (box) {
      observer.observe(box);
    });
  }

  function markSidebarAsNavigation() {
    var sidebar = document.getElementById("pst-primary-sidebar");
    if (sidebar && !sidebar.hasAttribute("role")) {
      sidebar.setAttribute("role", "navigation");
      sidebar.setAttribute("aria-label", "Book");
    }
  }

  function start() {
    markSidebarAsNavigation();
    watchScrollBoxes();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();

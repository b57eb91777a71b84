// What a reader sees of one page of the book at the window's current width, measured in the
// browser. tests/browser/conftest.py evaluates this function once at desktop width and once at
// phone width during its single visit of each page; the tests assert on what it returns.
//
// Every list names where each element is (its section's id, and ``y``: how far down the page and
// its full-page screenshot it starts) so that a failing test says what to change. Widths are CSS
// pixels.
() => {
  "use strict";
  const article = document.querySelector("article.bd-article") || document.querySelector("main");
  const px = (value) => Math.round(value);
  const scrolls = (element) => ["auto", "scroll"].includes(getComputedStyle(element).overflowX);
  const clips = (element) => getComputedStyle(element).overflowX !== "visible";
  const shown = (element) => element.getClientRects().length > 0 && getComputedStyle(element).visibility !== "hidden";
  const where = (element) => {
    const section = element.closest("section[id]");
    return section ? `#${section.id}` : "(top of the page)";
  };
  const all = (selector) => [...article.querySelectorAll(selector)].filter(shown);

  const style = getComputedStyle(article);
  const column = article.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);

  // The first ancestor that hides what sticks out of it on the sides, and does not scroll, when
  // `rect` sticks out of it; null when `rect` is all visible or can be scrolled to.
  const cutOffBy = (element, rect) => {
    for (let box = element.parentElement; box && box !== document.body; box = box.parentElement) {
      if (!clips(box)) continue;
      const edge = box.getBoundingClientRect();
      if (rect.right <= edge.right + 1 && rect.left >= edge.left - 1) continue;
      return scrolls(box) ? cutOffBy(box, edge) : box;
    }
    return null;
  };
  const describe = (element) => element && `${element.tagName.toLowerCase()}.${[...element.classList].join(".")}`;
  // How far down the page (and its full-page screenshot) an element starts.
  const y = (element) => px(element.getBoundingClientRect().top + window.scrollY);

  // Display equations. Clipped: wider than its box and the box does not scroll, or cut off by an
  // ancestor. MathJax keeps each equation's TeX, which names the equation in a failure.
  const texOf = (container) => {
    try {
      const item = MathJax.startup.document.getMathItemsWithin(container)[0];
      if (item) return item.math.trim().replace(/\s+/g, " ").slice(0, 80);
    } catch (error) { /* MathJax not on this page */ }
    return container.textContent.trim().slice(0, 80);
  };
  const equations = all('mjx-container[display="true"]').map((container) => {
    const math = container.querySelector(":scope > mjx-math") || container;
    const content = math.getBoundingClientRect();
    const wider = content.width > container.clientWidth + 1;
    const ownScroll = scrolls(container);
    const cut = cutOffBy(container, ownScroll ? container.getBoundingClientRect() : content);
    return {
      where: where(container), y: y(container), tex: texOf(container), box: px(container.clientWidth), content: px(content.width),
      scrolls: wider && ownScroll, clipped: (wider && !ownScroll) || cut !== null, clipped_by: describe(cut),
    };
  });

  // Code and output blocks. `fits`: how many characters of the block's font fit on one line.
  const charWidths = new Map();
  const charWidth = (pre) => {
    const font = getComputedStyle(pre).font;
    if (!charWidths.has(font)) {
      const probe = document.createElement("span");
      probe.textContent = "0".repeat(100);
      pre.appendChild(probe);
      charWidths.set(font, probe.getBoundingClientRect().width / 100);
      probe.remove();
    }
    return charWidths.get(font);
  };
  const kindOf = (pre) => {
    if (pre.closest(".cell_output")) return "output";
    if (pre.closest(".cell_input")) return "code";
    if (pre.closest(".highlight-pycon, .doctest")) return "doctest";
    return "literal";
  };
  const blocks = all("pre").map((pre) => {
    const preStyle = getComputedStyle(pre);
    const inner = pre.clientWidth - parseFloat(preStyle.paddingLeft) - parseFloat(preStyle.paddingRight);
    const lines = pre.textContent.replace(/\n$/, "").split("\n");
    const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), "");
    const rect = pre.getBoundingClientRect();
    return {
      where: where(pre), y: y(pre), kind: kindOf(pre), box: pre.clientWidth, content: pre.scrollWidth,
      chars: longest.length, line: longest.trim().slice(0, 70), fits: Math.floor(inner / charWidth(pre) + 0.01),
      font_px: parseFloat(preStyle.fontSize), scrolls: scrolls(pre), left: px(rect.left), right: px(rect.right),
      cut: describe(cutOffBy(pre, rect)),
    };
  });

  // Outputs printed as text that are tables: a rule of dashes under headings, or three lines in a
  // row with three or more columns separated by two spaces or more.
  // Returns the table's first line (its headings), or null.
  const tableIn = (text) => {
    const lines = text.split("\n");
    const rule = lines.findIndex((line) => /^\s*-{3,}(\s+-{2,})+\s*$/.test(line));
    if (rule > 0) return lines[rule - 1];
    let run = 0;
    for (let i = 0; i < lines.length; i++) {
      run = lines[i].trim().split(/\s{2,}/).length >= 3 ? run + 1 : 0;
      if (run >= 3) return lines[i - 2];
    }
    return null;
  };
  const textTables = all(".cell_output pre")
    .filter((pre) => tableIn(pre.textContent) !== null)
    .map((pre) => ({ where: where(pre), line: tableIn(pre.textContent).trim().slice(0, 70) }));

  // Figures: the width each is shown at and the width it was drawn for (its width attribute or
  // style; the PNG holds twice as many pixels, `natural`), the box that scrolls when it is wider
  // than the screen, whether the figure is wider than that box (seen only in part), and the link
  // a tap follows. The line of the figure's cell that draws it, to name the figure in a failure.
  const drawnBy = (img) => {
    const code = img.closest(".cell")?.querySelector(".cell_input pre")?.textContent || "";
    const lines = code.split("\n").map((line) => line.trim()).filter((line) => line && !line.startsWith("#"));
    return (lines.find((line) => /plot|subplots|imshow/.test(line) && !/plt\.show/.test(line)) || lines[0] || "").slice(0, 70);
  };
  const figures = all("img").map((img) => {
    const rect = img.getBoundingClientRect();
    let box = img.parentElement;
    while (box && box !== article && !scrolls(box)) box = box.parentElement;
    const boxRect = (box && box !== article ? box : img).getBoundingClientRect();
    return {
      where: where(img), y: y(img), src: (img.getAttribute("src") || "").split("/").pop(), alt: img.getAttribute("alt") || "",
      drawn_by: drawnBy(img),
      shown: px(rect.width), box_left: px(boxRect.left), box_right: px(boxRect.right),
      cut: describe(cutOffBy(img, rect)),
      // The width the figure may take: its block's content box (a cell's output is a little narrower
      // than the column).
      room: (() => {
        const holder = img.closest("div, figure, p") || article;
        const box = getComputedStyle(holder);
        return px(holder.clientWidth - parseFloat(box.paddingLeft) - parseFloat(box.paddingRight));
      })(),
      natural: img.naturalWidth, drawn_for: px(parseFloat(img.style.width || img.getAttribute("width") || "0")),
      wider_than_box: box && box !== article ? px(rect.right - boxRect.right) > 1 || px(boxRect.left - rect.left) > 1 : false,
      left: px(rect.left), right: px(rect.right),
      link: img.closest("a")?.getAttribute("href")?.split("/").pop() || null,
    };
  });

  // Tables: the package's (.mha-table) and those written in Markdown (the theme's scroll box).
  const NUMBER = /^[-+\u2212]?(\d[\d,]*(\.\d*)?|\.\d+)(e[-+]?\d+)?\s*(ns|µs|ms|s|B|KiB|MiB|GiB|%|x|×)?$/i;
  const tables = all(".mha-table, .pst-scrollable-table-container").map((box) => {
    const table = box.querySelector("table");
    const rect = box.getBoundingClientRect();
    const misaligned = [];
    const exponents = [];
    if (table && box.classList.contains("mha-table")) {
      const rows = [...table.tBodies].flatMap((body) => [...body.rows]);
      const columns = Math.max(0, ...rows.map((row) => row.cells.length));
      for (let c = 0; c < columns; c++) {
        const cells = rows.map((row) => row.cells[c]).filter((cell) => cell && cell.textContent.trim() !== "-");
        const numeric = cells.length > 0 && cells.every((cell) => NUMBER.test(cell.textContent.trim()));
        if (numeric && cells.some((cell) => getComputedStyle(cell).textAlign !== "right")) {
          misaligned.push(table.tHead ? table.tHead.rows[0].cells[c].textContent.trim() || `column ${c + 1}` : `column ${c + 1}`);
        }
      }
      for (const cell of table.querySelectorAll("td, th")) {
        if (/\d[eE][-+]?\d/.test(cell.textContent)) exponents.push(cell.textContent.trim());
      }
    }
    return {
      where: where(box), y: y(box), label: box.getAttribute("aria-label") || "", box: box.clientWidth,
      table: px(table ? table.getBoundingClientRect().width : 0), left: px(rect.left), right: px(rect.right),
      scrolls: scrolls(box), focusable: box.tabIndex === 0, misaligned, exponents, cut: describe(cutOffBy(box, rect)),
    };
  });

  // Punctuation after inline math: on the math's line (one box), and wrapped with it at all.
  const PUNCTUATION = /^[.,;:!?)\]}'\u2019\u201d\u2026]/;
  const brokenPunctuation = all(".math-nowrap")
    .filter((span) => span.getClientRects().length > 1)
    .map((span) => ({ where: where(span), text: span.textContent.trim().slice(-40) }));
  const loosePunctuation = all("span.math")
    .filter((span) => !span.parentElement.classList.contains("math-nowrap"))
    .filter((span) => span.nextSibling && span.nextSibling.nodeType === Node.TEXT_NODE && PUNCTUATION.test(span.nextSibling.textContent))
    .map((span) => ({ where: where(span), text: (span.textContent + span.nextSibling.textContent).trim().slice(0, 40) }));

  // Where the page's title starts, in page coordinates: a screenshot must show it there.
  const h1 = article.querySelector("h1");
  let heading = null;
  if (h1) {
    const range = document.createRange();
    range.selectNodeContents(h1);
    const rects = [...range.getClientRects()].filter((r) => r.width > 0 && r.height > 0);
    const top = Math.min(...rects.map((r) => r.top));
    const firstLine = rects.filter((r) => r.top < top + 4);
    heading = {
      left: px(Math.min(...firstLine.map((r) => r.left)) + window.scrollX),
      top: px(top + window.scrollY),
      bottom: px(Math.max(...firstLine.map((r) => r.bottom)) + window.scrollY),
    };
  }

  return {
    width: window.innerWidth,
    overflow: document.scrollingElement.scrollWidth - window.innerWidth,
    column: px(column),
    equations, blocks, text_tables: textTables, figures, tables,
    broken_punctuation: brokenPunctuation, loose_punctuation: loosePunctuation, heading,
  };
}

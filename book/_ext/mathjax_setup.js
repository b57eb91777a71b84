// MathJax set-up for the book, loaded after Sphinx's inline MathJax configuration (which it amends)
// and before MathJax itself (which is deferred). Two things, both for the accessibility tools in
// MathJax's right-click menu:
//
// 1. Speech rules from disk. The explorer (Accessibility > Activate) reads equations aloud with the
//    speech rule engine, which fetches sre/mathmaps/LOCALE.json with XMLHttpRequest; browsers refuse
//    that on file:// pages. The build also writes each shipped locale as sre/mathmaps/LOCALE.js, and
//    the loader below fetches that with a <script> tag, which works from disk and from a server.
// 2. Turning accessibility on from the menu. In MathJax 3.2.2 that re-render can hit a "retry" while
//    the speech rules load and then removes every equation from the page (mathjax/MathJax#3124,
//    fixed in MathJax 4). The wrapper is the work-around MathJax's maintainers give there.
(function () {
  "use strict";
  var here = document.currentScript ? document.currentScript.src : "";
  var rules = here.replace(/mathjax_setup\.js(\?.*)?$/, "es5/sre/mathmaps/");

  function loadLocale(locale) {
    return new Promise(function (resolve, reject) {
      var maps = window.SpeechRuleMaps || {};
      if (maps[locale]) {
        resolve(maps[locale]);
        return;
      }
      var script = document.createElement("script");
      script.src = rules + locale + ".js";
      script.onload = function () {
        var loaded = (window.SpeechRuleMaps || {})[locale];
        if (loaded) {
          resolve(loaded);
        } else {
          reject(new Error("the speech rules for " + locale + " did not load"));
        }
      };
      script.onerror = function () {
        reject(new Error("this book has no speech rules for " + locale));
      };
      document.head.appendChild(script);
    });
  }

  var config = (window.MathJax = window.MathJax || {});
  var loader = (config.loader = config.loader || {});
  // The a11y/sre component sets window.SREfeature.custom (the function the speech rule engine asks
  // for a locale's rules, as a JSON string) when it loads; replace it right after.
  loader["a11y/sre"] = Object.assign(loader["a11y/sre"] || {}, {
    checkReady: function () {
      window.SREfeature = Object.assign(window.SREfeature || {}, { custom: loadLocale });
      return Promise.resolve();
    },
  });

  var startup = (config.startup = config.startup || {});
  var ready = startup.ready;
  startup.ready = function () {
    var mathjax = MathJax._.mathjax.mathjax;
    var STATE = MathJax._.core.MathItem.STATE;
    var Menu = MathJax._.ui.menu.Menu.Menu;
    var rerender = Menu.prototype.rerender;
    Menu.prototype.rerender = function (start) {
      var menu = this;
      var from = start === undefined ? STATE.TYPESET : start;
      mathjax.handleRetriesFor(function () {
        rerender.call(menu, from);
      });
    };
    return ready ? ready.call(this) : MathJax.startup.defaultReady();
  };
})();

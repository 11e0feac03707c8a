// streamsemi console: keyboard shortcuts on the suggestion queue. No inline scripts anywhere
// (the Content-Security-Policy forbids them); forms work without this file.
(function () {
  "use strict";
  function current() {
    return document.querySelector("#queue li.suggestion.current");
  }
  function typing(ev) {
    var t = ev.target;
    return t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.isContentEditable);
  }
  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || typing(ev)) {
      return;
    }
    var item = current();
    if (!item) {
      return;
    }
    var button = null;
    if (/^[1-9]$/.test(ev.key)) {
      button = item.querySelector('button[data-key="' + ev.key + '"]');
    } else if (ev.key === "s") {
      button = item.querySelector('button[data-key="s"]');
    } else if (ev.key === "n") {
      var input = item.querySelector("input.new-label");
      if (input) {
        ev.preventDefault();
        input.focus();
      }
      return;
    }
    if (button) {
      ev.preventDefault();
      button.click();
    }
  });
  // the item under the pointer or with focus becomes the one the keys act on
  document.addEventListener("focusin", function (ev) {
    var li = ev.target.closest && ev.target.closest("#queue li.suggestion");
    if (li) {
      var cur = current();
      if (cur) { cur.classList.remove("current"); }
      li.classList.add("current");
    }
  });
})();

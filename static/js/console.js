/* The console's small behaviours; every page works without them.
 *
 * - relative times: <time data-rel> (console/templatetags/console_time.py) kept current;
 * - keyboard: j / k move between the rows of a queue or list ([data-row]), / focuses the
 *   page's search or filter, c claims, r resolves, a approves, d denies (the reason field
 *   focused, nothing sent before Enter), Escape closes, ? shows the keys;
 * - copy buttons: [data-copy] copies its value;
 * - live regions (htmx polling) pause while a form inside them is being filled in: a poll of
 *   an element with data-poll-pause-busy="<selector>" is cancelled (htmx:confirm) while that
 *   region is busy, and with data-poll-pause-present="<selector>" while that exists;
 * - [data-back] links go back in the history (their href is the fallback).
 * Nothing here or in htmx evaluates strings (the pages' CSP allows no eval, no inline script).
 */
(function () {
  "use strict";

  /* Controls that need script (copy buttons) show only when it runs. */
  document.documentElement.classList.add("js");

  var UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];

  function span(seconds) {
    seconds = Math.abs(seconds);
    for (var i = 0; i < UNITS.length; i++) {
      if (seconds >= UNITS[i][0]) return Math.floor(seconds / UNITS[i][0]) + " " + UNITS[i][1];
    }
    return "0 s";
  }

  function refreshTimes(root) {
    var now = Date.now();
    (root || document).querySelectorAll("time[data-rel]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (isNaN(at)) return;
      var seconds = (now - at) / 1000;
      if (el.dataset.rel === "age") {
        el.textContent = span(Math.max(seconds, 0));
      } else if (Math.abs(seconds) < 1) {
        el.textContent = "just now";
      } else {
        el.textContent = seconds > 0 ? span(seconds) + " ago" : "in " + span(seconds);
      }
    });
  }

  /* A live region is busy while someone works in it: a form field has focus or holds text,
     a disclosure is open, or a row is selected. Polling waits until it is not. */
  function busy(el) {
    if (!el) return false;
    if (el.querySelector("details[open], input[type=checkbox]:checked")) return true;
    var active = document.activeElement;
    if (active && el.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) return true;
    var typed = Array.prototype.some.call(el.querySelectorAll("input[type=text], input:not([type]), textarea"), function (f) {
      return f.value && f.value.trim() !== "";
    });
    return typed;
  }

  document.addEventListener("htmx:confirm", function (event) {
    var elt = event.detail.elt;
    if (!elt || !elt.getAttribute) return;
    var region = elt.getAttribute("data-poll-pause-busy");
    var present = elt.getAttribute("data-poll-pause-present");
    if ((region && busy(document.querySelector(region))) || (present && document.querySelector(present))) {
      event.preventDefault();
    }
  });

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-row]"));
  }

  function currentRow() {
    var active = document.activeElement;
    return active && active.closest ? active.closest("[data-row]") : null;
  }

  function move(step) {
    var all = rows();
    if (!all.length) return;
    var at = all.indexOf(currentRow());
    var next = all[Math.max(0, Math.min(all.length - 1, at < 0 ? 0 : at + step))];
    next.focus();
    next.scrollIntoView({ block: "nearest" });
  }

  /* a / d: choose the decision, focus the reason; Enter in it then sends that decision. */
  function decide(kind) {
    var row = currentRow() || rows()[0];
    var form = row ? row.querySelector("form[data-decide]") : null;
    if (!form) return false;
    form.dataset.chosen = kind === "a" ? "approve" : "deny";
    form.querySelectorAll("button[name=decision]").forEach(function (b) {
      b.classList.toggle("chosen", b.value === form.dataset.chosen);
    });
    var reason = form.querySelector("input[name=reason]");
    if (reason) reason.focus();
    return true;
  }

  document.addEventListener("keydown", function (event) {
    if (event.key !== "Enter" || !event.target.closest) return;
    var form = event.target.closest("form[data-decide]");
    if (!form || !form.dataset.chosen || event.target.tagName !== "INPUT") return;
    var button = form.querySelector("button[name=decision][value=" + form.dataset.chosen + "]");
    if (button && form.reportValidity()) {
      event.preventDefault();
      button.click();
    }
  }, true);

  function act(kind) {
    var row = currentRow() || rows()[0];
    if (!row) return false;
    var target = row.querySelector("[data-key='" + kind + "']");
    if (!target) return false;
    if (target.tagName === "BUTTON") {
      target.click();
      return true;
    }
    /* A form behind a disclosure: open it and focus its reason, nothing is sent yet. */
    var details = target.closest("details");
    if (details) details.open = true;
    /* the reason first (a comma list would pick the first field in the form instead) */
    var field = target.querySelector("input[name=reason]") || target.querySelector("input[name=text]") ||
      target.querySelector("input:not([type=hidden])");
    if (field) field.focus();
    return true;
  }

  function toggleHelp(show) {
    var help = document.getElementById("keys-help");
    if (!help) return;
    if (typeof help.showModal === "function") {
      if (show === false || help.open) help.close();
      else help.showModal();
    } else {
      help.hidden = !help.hidden;
    }
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    var active = document.activeElement;
    var typing = active && (/^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName) || active.isContentEditable);
    if (event.key === "Escape") {
      if (typing) active.blur();
      document.querySelectorAll("details[open]").forEach(function (d) { d.open = false; });
      toggleHelp(false);
      return;
    }
    if (typing) return;
    var handled = true;
    switch (event.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "/": {
        var search = document.querySelector("[data-search]");
        if (search) search.focus(); else handled = false;
        break;
      }
      case "?": toggleHelp(); break;
      case "c": handled = act("c"); break;
      case "r": handled = act("r"); break;
      case "a": handled = decide("a"); break;
      case "d": handled = decide("d"); break;
      default: handled = false;
    }
    if (handled) event.preventDefault();
  });

  document.addEventListener("click", function (event) {
    var back = event.target.closest ? event.target.closest("a[data-back]") : null;
    if (back && window.history.length > 1) {
      event.preventDefault();
      window.history.back();
    }
  });

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-copy]") : null;
    if (!button) return;
    var value = button.getAttribute("data-copy");
    var done = function () {
      var was = button.textContent;
      button.textContent = "copied";
      setTimeout(function () { button.textContent = was; }, 1200);
    };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(value).then(done, function () {});
    }
  });

  /* htmx swaps nothing on an error status: say what happened instead of failing silently. */
  function toast(text) {
    var box = document.getElementById("toasts");
    if (!box) return;
    /* a failing poll repeats itself: one toast per sentence */
    Array.prototype.forEach.call(box.querySelectorAll(".toast"), function (old) {
      if (old.textContent === text) old.remove();
    });
    var p = document.createElement("p");
    p.className = "toast toast-error";
    p.setAttribute("role", "alert");
    p.textContent = text;
    box.appendChild(p);
  }

  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    var said = xhr && xhr.getResponseHeader("X-Fenceline-Message");
    toast(said || "The console answered " + (xhr ? xhr.status : "an error") + ": reload the page to see the current state.");
  });
  document.addEventListener("htmx:sendError", function () {
    toast("The console did not answer (network). Reload the page to see whether the action took effect.");
  });

  document.addEventListener("htmx:afterSwap", function (event) { refreshTimes(event.target); });
  document.addEventListener("DOMContentLoaded", function () { refreshTimes(); });
  setInterval(refreshTimes, 30000);
})();

/* StateGuard's dashboard: live pages, local times, confirmations. No build step, no library.
 *
 * Live: a page listens on a websocket (consumers.py) and, when events arrive, re-reads itself
 * and swaps in the parts marked data-live-region: what a reload would show, nothing computed
 * here. A page with data-live="list" listens to every run (ws/runs/); data-live="run" to its
 * run (ws/runs/<code>/), and to every run only for the navigation's counts; data-live="workers"
 * to every run, at most one re-read per 2 s, and on a timer (heartbeats publish nothing). A
 * re-read brings the navigation's counts (live regions) and the workers banner with it: a
 * page that re-reads itself on every run's events asks for nothing else on them (50 open
 * pages asking for three things each kept the server's queue long: docs/benchmarks.md,
 * "The cockpit's pages"). The cockpit's pages and the runs list answer a re-read with those
 * and their live regions alone, one render shared by their open copies (dashboard/live.py).
 * After a dropped
 * connection the page reconnects with backoff and re-reads itself, so nothing is missed. The
 * only frame a page sends is a heartbeat ping: browsers do not expose websocket pings, and a
 * connection that died silently (a sleeping laptop, a proxy) would otherwise look live.
 */
(function () {
  "use strict";

  // ---- times: <time data-when datetime="ISO"> in the reader's locale, with "3 min ago" ------
  // (not for data-when="plain")
  var sameDay = new Intl.DateTimeFormat(undefined, { timeStyle: "medium" });
  var otherDay = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });
  var relFmt = new Intl.RelativeTimeFormat(undefined, { numeric: "auto", style: "short" });
  var UNITS = [[60, "second"], [3600, "minute"], [86400, "hour"], [604800, "day"],
               [2629800, "week"], [31557600, "month"], [Infinity, "year"]];

  function relative(date) {
    var seconds = (date.getTime() - Date.now()) / 1000;
    var size = 1;
    for (var i = 0; i < UNITS.length; i++) {
      if (Math.abs(seconds) < UNITS[i][0]) {
        return relFmt.format(Math.round(seconds / size), UNITS[i][1]);
      }
      size = UNITS[i][0];
    }
    return "";
  }

  function formatTimes(root) {
    var today = new Date().toDateString();
    root.querySelectorAll("time[data-when]").forEach(function (el) {
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) return;
      if (!el.dataset.formatted) {
        var fmt = date.toDateString() === today ? sameDay : otherDay;
        el.textContent = fmt.format(date);
        el.title = date.toLocaleString(undefined, { dateStyle: "full", timeStyle: "long" });
        if (el.dataset.when !== "plain") {  // the start of a span: its end gets the hint
          var hint = document.createElement("span");
          hint.className = "rel";
          el.appendChild(hint);
        }
        el.dataset.formatted = "1";
      }
      var rel = el.querySelector(".rel");
      if (rel) rel.textContent = " · " + relative(date);
    });
  }

  // ---- waiting times: <span data-waited-since="ISO">waiting 3 min 5 s</span>, kept current ----
  // The words are the server's (templatetags/dashboard.py, duration).
  function duration(seconds) {
    var whole = Math.max(Math.floor(seconds), 0);
    if (whole < 60) return whole + " s";
    var minutes = Math.floor(whole / 60), rest = whole % 60;
    if (minutes < 60) return minutes + " min" + (rest ? " " + rest + " s" : "");
    var hours = Math.floor(minutes / 60);
    minutes = minutes % 60;
    return hours + " h" + (minutes ? " " + minutes + " min" : "");
  }

  function formatWaits(root) {
    root.querySelectorAll("[data-waited-since]").forEach(function (el) {
      var since = new Date(el.dataset.waitedSince);
      if (!isNaN(since.getTime())) el.textContent = "waiting " + duration((Date.now() - since) / 1000);
    });
  }

  // ---- announcements, for everyone (a message) and for screen readers (aria-live) --------------
  function announce(text, kind) {
    var live = document.getElementById("live-announce");
    if (live) live.textContent = text;
    var box = document.getElementById("messages");
    if (!box || !kind) return;
    var p = document.createElement("p");
    p.className = "message message-" + kind;
    p.textContent = text;  // text, never markup
    box.appendChild(p);
    while (box.children.length > 3) box.removeChild(box.firstElementChild);
  }

  // ---- confirmations: <button data-dialog="id"> opens <dialog id> as a modal ----------------
  var openers = {};

  function openDialog(dialog, opener) {
    if (!dialog.showModal) return false;
    var stale = dialog.querySelector("[data-stale]");
    if (stale) stale.hidden = true;
    if (opener && opener.dataset.dialog) openers[dialog.id] = opener.dataset.dialog;
    dialog.showModal();
    return true;
  }

  document.addEventListener("click", function (event) {
    var opener = event.target.closest("[data-dialog]");
    if (opener) {
      var dialog = document.getElementById(opener.dataset.dialog);
      if (dialog && openDialog(dialog, opener)) event.preventDefault();
      return;
    }
    var closer = event.target.closest("[data-close]");
    if (closer && closer.closest("dialog")) closer.closest("dialog").close();
  });

  document.addEventListener("close", function (event) {
    var dialog = event.target;
    if (!(dialog instanceof HTMLDialogElement)) return;
    var back = openers[dialog.id] && document.querySelector('[data-dialog="' + openers[dialog.id] + '"]');
    if (back) back.focus();
    if (refreshWaiting) schedule(0);
  }, true);

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.closest("dialog")) return;
    form.querySelectorAll("button[type=submit]").forEach(function (b) { b.disabled = true; });
  });

  // ---- live re-reads ------------------------------------------------------------------------
  var timer = null, refreshing = false, again = false, refreshWaiting = false;
  var toggled = {};  // details the reader opened or closed: kept as they are across re-reads

  document.addEventListener("toggle", function (event) {
    var el = event.target;
    if (el.tagName === "DETAILS" && el.id && !el.dataset.swapping) toggled[el.id] = el.open;
  }, true);

  function schedule(delay) {
    if (timer) return;
    timer = setTimeout(function () { timer = null; refresh(); }, delay);
  }

  // A re-read on runs' events, at most one per `every` ms, at the next multiple of it on the
  // clock (shifted by the page's address): the open copies of a page, having got the same
  // events, ask at the same moment and are answered with one render (dashboard/live.py), and
  // different pages ask at different moments, so the server has fewer requests at once.
  function pageShift(every) {
    var text = location.pathname + location.search, hash = 0;
    for (var i = 0; i < text.length; i++) hash = (hash * 31 + text.charCodeAt(i)) % 1000003;
    return hash % every;
  }

  function scheduleAligned(every) {
    schedule(every - (Date.now() - pageShift(every)) % every);
  }

  function dialogOpen() {
    if (!document.querySelector("dialog[open]")) return false;
    // Not under the reader's hands: swap once the dialog closes, and say the run moved on.
    refreshWaiting = true;
    document.querySelectorAll("dialog[open] [data-stale]").forEach(function (p) { p.hidden = false; });
    return true;
  }

  // Each live region as the server last rendered it (before this script touched it), less
  // the CSRF tokens that differ on every render: a re-read that changed nothing swaps nothing,
  // and does not tell the reader of an open confirmation that the run moved on.
  var rendered = {};

  // Nor do the parts drawn against the clock (data-live-clock: a live run's timeline, whose
  // open bars end "now"): they differ on every read, and change with the rest when it does.
  // Nor the waits the script keeps current itself (data-waited-since: formatWaits).
  function normalized(el) {
    var copy = el.cloneNode(true);
    copy.querySelectorAll("[data-live-clock]").forEach(function (c) { c.remove(); });
    copy.querySelectorAll("[data-waited-since]").forEach(function (c) { c.textContent = ""; });
    return copy.outerHTML.replace(/name="csrfmiddlewaretoken" value="[^"]*"/g, "");
  }

  function remember(root) {
    root.querySelectorAll("[data-live-region][id]").forEach(function (el) {
      rendered[el.id] = normalized(el);
    });
  }

  function changed(doc) {
    return Array.prototype.some.call(document.querySelectorAll("[data-live-region][id]"), function (el) {
      var fresh = doc.getElementById(el.id);
      return fresh !== null && normalized(fresh) !== rendered[el.id];
    });
  }

  // The newest events' place in the order of all (their frames' "seq"), told to the server with
  // a re-read: it may then answer with a render shared with other pages, made after those
  // events' commits (dashboard/live.py). Unknown (null) from a socket's opening, when events
  // may have been missed, until a frame says; and after a frame that does not say, until a
  // re-read asked without it (which the server renders after it arrived) has gone.
  var seen = null;

  function sawEvents(seq) {
    if (typeof seq !== "number") seen = false;
    else if (seen !== false) seen = Math.max(seen || 0, seq);
  }

  function refresh() {
    if (refreshing) { again = true; return; }
    refreshWaiting = false;
    refreshing = true;
    var headers = { "X-Live-Refresh": "1" };
    if (typeof seen === "number") headers["X-Live-Seen"] = String(seen);
    else seen = null;
    fetch(location.href, { cache: "no-store", credentials: "same-origin", headers: headers })
      .then(function (response) {
        if (response.redirected && /\/login\//.test(new URL(response.url).pathname)) {
          location.reload();  // the session ended: show the login page
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        showBanner(doc);
        if (changed(doc) && !dialogOpen()) swap(doc);
      })
      .catch(function () { /* the socket's reconnect re-reads again */ })
      .then(function () {
        refreshing = false;
        if (again) { again = false; schedule(100); }
      });
  }

  function rows(root) {
    var found = {};
    root.querySelectorAll("tr[data-run]").forEach(function (tr) { found[tr.dataset.run] = tr.dataset.status; });
    return found;
  }

  function swap(doc) {
    var request = document.querySelector("[data-request]");
    var hadRequest = request && request.dataset.request;
    var oldStatus = document.querySelector("[data-run-status]");
    oldStatus = oldStatus && oldStatus.dataset.runStatus;
    var before = rows(document);
    // The runs ticked for a batch stay ticked across re-reads (the rows are new elements).
    var ticked = {};
    document.querySelectorAll("input[data-pick]:checked").forEach(function (b) { ticked[b.value] = true; });
    var active = document.activeElement;
    var focusId = active && (active.id || (active.closest("details[id]") || {}).id);
    // A frame scrolled sideways (the timeline on a phone) stays where the reader left it.
    var scrolled = {};
    document.querySelectorAll("[data-keep-scroll][id]").forEach(function (el) { scrolled[el.id] = el.scrollLeft; });
    remember(doc);
    document.querySelectorAll("[data-live-region][id]").forEach(function (el) {
      var fresh = doc.getElementById(el.id);
      if (fresh) el.replaceWith(document.importNode(fresh, true));
    });
    Object.keys(toggled).forEach(function (id) {
      var d = document.getElementById(id);
      if (d && d.open !== toggled[id]) { d.dataset.swapping = "1"; d.open = toggled[id]; delete d.dataset.swapping; }
    });
    if (focusId && document.getElementById(focusId) && document.activeElement === document.body) {
      var target = document.getElementById(focusId);
      (target.tagName === "DETAILS" ? target.querySelector("summary") : target).focus();
    }
    document.querySelectorAll("input[data-pick]").forEach(function (b) { b.checked = !!ticked[b.value]; });
    Object.keys(scrolled).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) el.scrollLeft = scrolled[id];
    });
    if (doc.title) document.title = doc.title;  // a live re-read's fragment has none (live.py)
    formatTimes(document);
    formatWaits(document);
    var after = document.querySelectorAll("tr[data-run]");
    after.forEach(function (tr) {
      if (!(tr.dataset.run in before)) tr.classList.add("row-new");
      else if (before[tr.dataset.run] !== tr.dataset.status) tr.classList.add("row-changed");
    });
    if (hadRequest && !document.querySelector("[data-request]")) {
      announce("A worker has taken up the request: " + hadRequest + ".", "success");
    }
    var status = document.querySelector("[data-run-status]");
    if (oldStatus && status && status.dataset.runStatus !== oldStatus) {
      announce("The run is now " + status.dataset.runStatus.replace("_", " ") + ".", null);
    }
  }

  function refreshCounts() {
    var nav = document.querySelector("[data-counts-url]");
    if (!nav) return;
    fetch(nav.dataset.countsUrl, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (counts) {
        if (!counts) return;
        document.querySelectorAll("[data-count]").forEach(function (el) {
          var n = counts[el.dataset.count];
          if (typeof n !== "number") return;
          var label = el.childNodes[1];
          // counts stop at the cap (pages.COUNT_CAP): one more means "more than that"
          var cap = Number(nav.dataset.countCap);
          if (label) label.textContent = cap && n > cap ? cap + "+" : String(n);
          el.classList.toggle(el.dataset.count === "approvals" ? "count-wait" : "count-bad", n > 0);
        });
      })
      .catch(function () {});
  }
  var countsTimer = null;
  function scheduleCounts() {
    if (countsTimer) return;
    countsTimer = setTimeout(function () { countsTimer = null; refreshCounts(); }, 1000);
  }

  // ---- the banner that says no worker is alive: asked for again every few seconds ------------
  // Nothing is published when a worker dies or starts, so the page asks (a small GET; not
  // while the page is hidden). The server renders it: includes/workers.html.
  // STATEGUARD_WORKERS_POLL_SECONDS, on the banner; a worker beats every 15 s (monitoring/heartbeat.py)
  var WORKERS_EVERY = 15000;
  var workersTimer = null;

  // From the banner's own answer or a page's re-read: swapped whenever it differs, a
  // confirmation open or not (it is not what the reader confirms). Where only its ages moved
  // (data-ticks: "has waited 8 min 8 s"), their text changes in place: a banner replaced at
  // every re-read would take the link the reader is clicking away from under the pointer.
  function showBanner(doc) {
    var banner = document.getElementById("workers-banner");
    var fresh = doc.getElementById("workers-banner");
    if (!banner || !fresh) return;
    if (untimed(fresh) !== untimed(banner)) {
      banner.replaceWith(document.importNode(fresh, true));
      return;
    }
    var ages = fresh.querySelectorAll("[data-ticks]");
    banner.querySelectorAll("[data-ticks]").forEach(function (el, i) {
      if (el.textContent !== ages[i].textContent) el.textContent = ages[i].textContent;
    });
  }

  function untimed(el) {
    var copy = el.cloneNode(true);
    copy.querySelectorAll("[data-ticks]").forEach(function (t) { t.textContent = ""; });
    return copy.innerHTML.trim();
  }

  function refreshWorkers() {
    var banner = document.getElementById("workers-banner");
    if (!banner || document.visibilityState === "hidden") return;
    fetch(banner.dataset.workersUrl, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) { return r.ok && !r.redirected ? r.text() : null; })
      .then(function (html) {
        if (html) showBanner(new DOMParser().parseFromString(html, "text/html"));
      })
      .catch(function () { /* the next round asks again */ });
  }

  // A run's event on a page that does not re-read itself on it: the navigation's counts, and
  // the banner while it warns, since something ran (a worker that just started has beaten by
  // then, and the banner goes). A banner that does not warn waits for its timer: a run's
  // event does not say that the workers died.
  function onOtherRuns() {
    scheduleCounts();
    if (workersTimer || !document.querySelector("#workers-banner [role=alert]")) return;
    workersTimer = setTimeout(function () { workersTimer = null; refreshWorkers(); }, 1000);
  }

  // ---- websockets with backoff and a heartbeat ------------------------------------------------
  var sockets = [];

  function setIndicator() {
    var el = document.getElementById("live-indicator");
    if (!el || !sockets.length) return;
    var up = sockets.every(function (s) { return s.open; });
    el.hidden = false;
    el.dataset.state = up ? "on" : "off";
    // The page's own connection: whether workers are alive is the banner's to say.
    el.textContent = up ? "● Live updates" : "○ Reconnecting…";
    el.title = up ? "This page updates by itself." : "The live connection dropped; reconnecting.";
  }

  function LiveSocket(path, onEvents, onOpen) {
    this.path = path;
    this.onEvents = onEvents;
    this.onOpen = onOpen;
    this.failures = 0;
    this.opened = false;
    this.open = false;
    sockets.push(this);
    this.connect();
  }

  LiveSocket.prototype.connect = function () {
    var self = this;
    clearTimeout(self.retryTimer);
    var ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + self.path);
    self.ws = ws;
    ws.onopen = function () {
      var reconnect = self.opened;
      self.opened = self.open = true;
      self.failures = 0;
      setIndicator();
      self.heartbeat();
      if (reconnect) announce("Live updates are back.", null);
      seen = null;
      // Re-read on every open, the first too: what changed between the page's render and
      // this moment was published before the socket listened.
      self.onOpen();
    };
    ws.onmessage = function (message) {
      var data;
      try { data = JSON.parse(message.data); } catch (e) { return; }
      if (data.type === "pong") { clearTimeout(self.pongTimer); return; }
      if ((data.type === "run.events" || data.type === "batch.events") &&
          Array.isArray(data.events)) {
        sawEvents(data.seq);
        self.onEvents(data.events);
      }
    };
    ws.onclose = function () {
      if (self.ws !== ws) return;
      var was = self.open;
      self.open = false;
      clearTimeout(self.pingTimer);
      clearTimeout(self.pongTimer);
      setIndicator();
      if (was) announce("The live connection dropped; reconnecting.", null);
      // 0.5 s, 1 s, 2 s ... up to 30 s, with jitter so that a server's restart is not
      // answered by every page at the same moment.
      var delay = Math.min(30000, 500 * Math.pow(2, self.failures++)) * (0.75 + Math.random() / 2);
      self.retryTimer = setTimeout(function () { self.connect(); }, delay);
    };
  };

  LiveSocket.prototype.heartbeat = function () {
    var self = this;
    clearTimeout(self.pingTimer);
    self.pingTimer = setTimeout(function () {
      if (!self.open) return;
      self.ws.send(JSON.stringify({ type: "ping" }));
      self.pongTimer = setTimeout(function () { self.ws.close(); }, 10000);
      self.heartbeat();
    }, 25000);
  };

  LiveSocket.prototype.wake = function () {
    if (this.open) return;
    this.failures = 0;
    this.connect();
  };

  function wakeAll() { sockets.forEach(function (s) { s.wake(); }); }
  window.addEventListener("online", wakeAll);
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") wakeAll();
  });

  // ---- the page ----------------------------------------------------------------------------
  function init() {
    var body = document.body;
    remember(document);
    formatTimes(document);
    formatWaits(document);
    setInterval(function () { formatTimes(document); }, 30000);
    setInterval(function () { formatWaits(document); }, 1000);
    var workersBanner = document.getElementById("workers-banner");
    setInterval(refreshWorkers, Number(workersBanner && workersBanner.dataset.workersEvery) || WORKERS_EVERY);
    document.addEventListener("visibilitychange", refreshWorkers);
    document.querySelectorAll("input[data-timezone]").forEach(function (input) {
      if (!input.value) input.value = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
    });
    document.querySelectorAll("select[data-range]").forEach(function (select) {
      select.addEventListener("change", function () {
        document.querySelectorAll(".custom-range").forEach(function (el) {
          if (select.value === "custom") el.removeAttribute("data-hidden");
          else el.setAttribute("data-hidden", "");
        });
      });
    });
    // The runs list from the keyboard: j and k move the focus to the next or previous run's
    // link (its row shows it: CSS :focus-within), Enter opens it as any focused link does.
    // Not while typing in a field, nor with a modifier (the browser's shortcuts).
    document.addEventListener("keydown", function (event) {
      if (event.key !== "j" && event.key !== "k") return;
      if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
      var target = event.target;
      if (target.closest && target.closest("input, select, textarea, [contenteditable], dialog[open]")) return;
      var links = Array.prototype.slice.call(document.querySelectorAll("tbody[data-rows] a.run-link"));
      if (!links.length) return;
      // From the row whose link has the focus; from the first row otherwise.
      var active = document.activeElement;
      var row = active && active.closest ? active.closest("tbody[data-rows] tr[data-run]") : null;
      var at = row ? links.indexOf(row.querySelector("a.run-link")) : -1;
      var next = at < 0 ? 0 : Math.min(Math.max(at + (event.key === "j" ? 1 : -1), 0), links.length - 1);
      event.preventDefault();
      links[next].focus();
      links[next].closest("tr").scrollIntoView({block: "nearest"});
    });
    document.addEventListener("change", function (event) {  // tick every run on the page
      if (!event.target.matches("input[data-pick-all]")) return;
      document.querySelectorAll("input[data-pick]").forEach(function (b) { b.checked = event.target.checked; });
    });
    var open = document.querySelector("dialog[open]");  // ?confirm=..., the no-script way
    if (open && open.showModal) {
      open.close();
      openDialog(open, null);
      // Re-reads of this page must not open it again once it is closed.
      var params = new URLSearchParams(location.search);
      params.delete("confirm");
      history.replaceState(null, "", location.pathname + (params.toString() ? "?" + params : ""));
    }

    if (body.dataset.live === "list") {
      // data-live-every: a page that counts many runs (an agent's map) re-reads less often.
      var every = Number(body.dataset.liveEvery) || 300;
      new LiveSocket("/ws/runs/", function () { scheduleAligned(every); }, function () { schedule(0); });
    } else if (body.dataset.live === "incidents") {
      // Groups move with every run that fails or is retried: re-read at most every 2 s.
      new LiveSocket("/ws/runs/", function () { scheduleAligned(2000); }, function () { schedule(0); });
    } else if (body.dataset.live === "run" && body.dataset.run) {
      new LiveSocket("/ws/runs/" + body.dataset.run + "/", function () { schedule(120); },
                     function () { schedule(0); });
      new LiveSocket("/ws/runs/", onOtherRuns, scheduleCounts);
    } else if (body.dataset.live === "batch" && body.dataset.batch) {
      // Its progress, and its runs' statuses as workers carry out what it asked of them.
      new LiveSocket("/ws/batches/" + body.dataset.batch + "/", function () { schedule(150); },
                     function () { schedule(0); });
      new LiveSocket("/ws/runs/", function () { schedule(1000); }, function () { schedule(0); });
    } else if (body.dataset.live === "workers") {
      // The workers page: runs' events move its numbers (a re-read at most every 2 s, however
      // many arrive), and workers' heartbeats publish nothing, so it re-reads on a timer too.
      new LiveSocket("/ws/runs/", function () { scheduleAligned(2000); }, function () { schedule(0); });
      setInterval(function () {
        if (document.visibilityState !== "hidden") schedule(0);
      }, Number(body.dataset.liveEvery) || WORKERS_EVERY);
    } else if (document.querySelector("[data-counts-url]")) {
      new LiveSocket("/ws/runs/", onOtherRuns, scheduleCounts);
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();

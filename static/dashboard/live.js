/* Fusion Missions dashboard: live regions and action buttons. Plain JavaScript, no build.
 *
 * Pages are server-rendered and complete without this script. With it:
 * - the page follows its event stream (<body data-live-stream>, an EventSource) from the
 *   event id it was rendered at (data-live-last-id), so nothing between render and
 *   connect is lost; a reconnect resumes from the last id received (replay), and a
 *   `stream-reset` (id too old) re-fetches every region;
 * - it listens to every type of the server's event catalogue (missions.event_catalogue.EVENT_TYPES,
 *   rendered into the page as the JSON element #live-event-types): an EventSource needs one
 *   listener per type;
 * - each region (data-live-region) names a fragment URL (data-live-url), the event types
 *   that concern it (data-live-on, `*` suffix = prefix) and optionally the ids it shows
 *   (data-live-keys "feature:12 milestone:3"); an event re-fetches the affected regions
 *   (coalesced over a few milliseconds) and swaps them in without reloading the page;
 *   inside a data-live-group, an event that no keyed child claims refreshes the group;
 * - forms marked data-action POST to the API as JSON with the CSRF token and show the
 *   answer, or the API's error (e.g. 409 validation_already_running), in the page.
 */
(function () {
  "use strict";

  function eventTypes() {
    var el = document.getElementById("live-event-types");
    try {
      var types = el ? JSON.parse(el.textContent) : [];
      return Array.isArray(types) ? types : [];
    } catch (e) {
      return [];
    }
  }

  var EVENT_TYPES = eventTypes();
  var KEY_FIELDS = {
    feature: "feature", source: "feature", root: "feature", fix: "feature", milestone: "milestone",
    slice: "slice", run: "run", assertion: "assertion", review: "review", task: "task"
  };
  var COALESCE_MS = 25;

  var body = document.body;
  var live = {
    received: [], resets: 0, updates: 0, errors: [], state: "idle", paused: false, source: null,
    lastId: body.getAttribute("data-live-last-id") || "", eventTypes: EVENT_TYPES
  };
  window.fusionLive = live;

  function words(el, attr) {
    return (el.getAttribute(attr) || "").split(/\s+/).filter(Boolean);
  }

  function typeMatches(patterns, type) {
    return patterns.some(function (p) {
      return p === "*" || p === type || (p.slice(-1) === "*" && type.indexOf(p.slice(0, -1)) === 0);
    });
  }

  function eventKeys(data) {
    var keys = {};
    Object.keys(KEY_FIELDS).forEach(function (field) {
      var v = data[field];
      if (typeof v === "number" || (typeof v === "string" && /^\d+$/.test(v))) {
        keys[KEY_FIELDS[field] + ":" + v] = true;
      }
    });
    return keys;
  }

  function claims(region, keys) {
    return words(region, "data-live-keys").some(function (k) { return keys[k]; });
  }

  function findRegion(name) {
    return document.querySelector('[data-live-region="' + name + '"]');
  }

  function allRegions() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-live-region]"));
  }

  function inGroup(region) {
    return !!(region.parentElement && region.parentElement.closest("[data-live-group]"));
  }

  /* The names of the regions an event concerns. */
  function affected(type, data) {
    var keys = eventKeys(data);
    var hasKeys = Object.keys(keys).length > 0;
    var out = [];
    allRegions().forEach(function (region) {
      if (inGroup(region) || !typeMatches(words(region, "data-live-on"), type)) { return; }
      var name = region.getAttribute("data-live-region");
      if (region.hasAttribute("data-live-group")) {
        var children = Array.prototype.slice.call(region.querySelectorAll("[data-live-region]"));
        var claimed = hasKeys ? children.filter(function (c) {
          return typeMatches(words(c, "data-live-on"), type) && claims(c, keys);
        }) : [];
        if (claimed.length) {
          claimed.forEach(function (c) { out.push(c.getAttribute("data-live-region")); });
        } else {
          out.push(name);
        }
        return;
      }
      if (region.hasAttribute("data-live-keys") && !typeMatches(words(region, "data-live-any"), type)) {
        if (claims(region, keys)) { out.push(name); }
        return;
      }
      out.push(name);
    });
    return out;
  }

  /* ---- fetching and swapping fragments ------------------------------------------ */

  var dirty = {};
  var timer = null;
  var inflight = {};
  var again = {};

  function schedule(names) {
    names.forEach(function (n) { dirty[n] = true; });
    if (!timer && names.length) { timer = setTimeout(flush, COALESCE_MS); }
  }

  function flush() {
    timer = null;
    var names = Object.keys(dirty);
    dirty = {};
    var elements = names.map(findRegion);
    names.forEach(function (name, i) {
      var el = elements[i];
      if (!el) { return; }
      // A dirty group re-renders its children anyway.
      var covered = elements.some(function (other) { return other && other !== el && other.contains(el); });
      if (!covered) { refresh(name); }
    });
  }

  function refreshAll() {
    schedule(allRegions().filter(function (r) { return !inGroup(r); }).map(function (r) {
      return r.getAttribute("data-live-region");
    }));
  }
  live.refreshAll = refreshAll;

  function refresh(name) {
    if (inflight[name]) { again[name] = true; return; }
    var el = findRegion(name);
    if (!el) { return; }
    inflight[name] = true;
    fetch(el.getAttribute("data-live-url"), {
      credentials: "same-origin", cache: "no-store", headers: { "X-Requested-With": "fetch" }
    }).then(function (response) {
      if (response.ok && response.headers.get("X-Fusion-Fragment") === "1") {
        return response.text().then(function (html) { swap(name, html); });
      }
      if (response.status === 404) {
        setStatus("gone", "This page's object is gone, or you may no longer see it.");
        disconnect();
      } else if (response.ok) {
        setStatus("signed-out", "Your session has ended: reload the page to sign in again.");
        disconnect();
      } else {
        setStatus("error", "Could not refresh part of the page (HTTP " + response.status + ").");
      }
      return null;
    }).catch(function () {
      setStatus("offline", "The server cannot be reached; retrying.");
    }).then(function () {
      delete inflight[name];
      if (again[name]) { delete again[name]; refresh(name); }
    });
  }

  function swap(name, html) {
    var el = findRegion(name);
    if (!el) { return; }
    var template = document.createElement("template");
    template.innerHTML = html.trim();
    var fresh = template.content.firstElementChild;
    if (!fresh) { return; }
    var open = {}, closed = {};
    Array.prototype.forEach.call(el.querySelectorAll("details[id]"), function (d) {
      (d.open ? open : closed)[d.id] = true;
    });
    var active = document.activeElement;
    var focusKey = active && el.contains(active) ? keyOf(active) : null;
    el.replaceWith(fresh);
    Array.prototype.forEach.call(fresh.querySelectorAll("details[id]"), function (d) {
      if (open[d.id]) { d.open = true; } else if (closed[d.id]) { d.open = false; }
    });
    if (focusKey) {
      var target = fresh.querySelector(focusKey);
      if (target) { target.focus({ preventScroll: true }); }
    }
    fresh.classList.add("live-updated");
    setTimeout(function () { fresh.classList.remove("live-updated"); }, 1200);
    live.updates += 1;
    document.dispatchEvent(new CustomEvent("fusion:updated", { detail: { region: name } }));
  }

  function keyOf(el) {
    if (el.id) { return "#" + CSS.escape(el.id); }
    if (el.getAttribute("data-button")) { return '[data-button="' + el.getAttribute("data-button") + '"]'; }
    if (el.getAttribute("href")) { return 'a[href="' + el.getAttribute("href") + '"]'; }
    return null;
  }

  /* ---- the event stream ------------------------------------------------------------ */

  var retries = 0;
  var retryTimer = null;

  function setStatus(state, text) {
    live.state = state;
    body.setAttribute("data-live-state", state);
    var label = document.querySelector("[data-live-status-text]");
    var texts = {
      connecting: "Connecting to live updates…", connected: "Live: this page updates by itself.",
      reconnecting: "Connection lost; reconnecting…", paused: "Live updates paused.",
      forbidden: "Live updates refused: you may not see this mission."
    };
    if (label) { label.textContent = text || texts[state] || state; }
    var bar = document.querySelector("[data-live-bar]");
    if (bar) { bar.setAttribute("data-state", state); }
  }

  function remember(event) {
    if (event.lastEventId && event.lastEventId !== "error") { live.lastId = event.lastEventId; }
  }

  function onEvent(event) {
    remember(event);
    var data;
    try { data = JSON.parse(event.data); } catch (e) { return; }
    live.received.push({ type: event.type, seq: data.seq, mission: data.mission, id: event.lastEventId });
    if (live.received.length > 1000) { live.received.shift(); }
    schedule(affected(event.type, data));
  }

  function streamUrl() {
    var url = body.getAttribute("data-live-stream");
    if (live.lastId) {
      url += (url.indexOf("?") >= 0 ? "&" : "?") + "lastEventId=" + encodeURIComponent(live.lastId);
    }
    return url;
  }

  function connect() {
    if (!window.EventSource || !body.getAttribute("data-live-stream")) { return; }
    closeSource();
    live.paused = false;
    clearTimeout(retryTimer);
    var source = new EventSource(streamUrl(), { withCredentials: true });
    live.source = source;
    setStatus("connecting");
    source.addEventListener("stream-open", function () { retries = 0; setStatus("connected"); });
    source.addEventListener("stream-reset", function (event) {
      // Our last id is older than what the server keeps: reload the page's state.
      remember(event);
      live.resets += 1;
      refreshAll();
    });
    source.addEventListener("stream-error", function (event) {
      var data = {};
      try { data = JSON.parse(event.data); } catch (e) { /* keep {} */ }
      live.errors.push(data);
      closeSource();
      if (data.condition === "forbidden") {
        setStatus("forbidden");
      } else if (data.condition === "channels-changed") {
        // The missions this user may see changed (a membership was removed): start a
        // new stream over the new set, and reload what the page shows.
        live.lastId = "";
        refreshAll();
        connect();
      } else {
        setStatus("error", "Live updates failed: " + (data.text || "unknown error") + ". Retrying.");
        later();
      }
    });
    EVENT_TYPES.forEach(function (type) { source.addEventListener(type, onEvent); });
    source.onerror = function () {
      if (source !== live.source) { return; }
      if (source.readyState === EventSource.CLOSED) {
        closeSource();
        setStatus("offline", "Live updates stopped; retrying.");
        later();
      } else {
        setStatus("reconnecting");
      }
    };
    updateToggle();
  }

  function later() {
    retries += 1;
    clearTimeout(retryTimer);
    retryTimer = setTimeout(function () { if (!live.paused) { connect(); } }, Math.min(500 * Math.pow(2, retries), 15000));
  }

  function closeSource() {
    if (live.source) { live.source.close(); live.source = null; }
  }

  function disconnect() {
    live.paused = true;
    clearTimeout(retryTimer);
    closeSource();
    setStatus("paused");
    updateToggle();
  }

  live.connect = connect;
  live.disconnect = disconnect;

  function updateToggle() {
    var toggle = document.querySelector("[data-live-toggle]");
    if (!toggle) { return; }
    toggle.hidden = false;
    toggle.textContent = live.paused ? "Resume live updates" : "Pause live updates";
    toggle.setAttribute("aria-pressed", live.paused ? "true" : "false");
  }

  /* ---- action buttons ---------------------------------------------------------------- */

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  function showResult(kind, text) {
    var box = document.querySelector("[data-action-result]");
    if (!box) { window.alert(text); return; }
    box.hidden = false;
    box.className = "action-result notice " + (kind === "ok" ? "notice--ok" : "notice--error");
    box.setAttribute("role", kind === "ok" ? "status" : "alert");
    box.setAttribute("data-kind", kind);
    box.textContent = text;
  }

  function successText(action, status, data) {
    var text = action + ": done";
    if (data && data.run && data.ok !== undefined) {
      text = action + " of run #" + data.run + ": " + (data.ok ? "reproduced" : "NOT reproduced");
      if (data.replayed) { text += " (replayed " + data.replayed + (data.error_code ? " " + data.error_code : "") + ")"; }
      if (data.verdict_sha256) { text += ", verdict sha256 " + data.verdict_sha256.slice(0, 16) + "…"; }
      if (data.integrity_error) { text += ": journal integrity error: " + data.integrity_error; }
      if (data.problems && data.problems.length) { text += ": " + data.problems.join("; "); }
      return text + " (HTTP " + status + ")";
    }
    if (data && data.id && data.state && !data.outcome) {
      text = action + ": review #" + data.id + " requested (" + data.state + "); it appears under Advisory reviews";
    } else if (data && data.outcome) {
      text = action + ": " + data.outcome + (data.id ? " — run #" + data.id : "");
      if (data.detail) { text += " (" + data.detail + ")"; }
    } else if (data && data.key && data.title) {
      text = action + ": " + data.key + " — " + data.title;
    } else if (data && data.status) {
      text = action + ": mission is " + data.status + (data.autopilot !== undefined ? ", autopilot " + (data.autopilot ? "on" : "off") : "");
    }
    return text + " (HTTP " + status + ")";
  }

  function errorText(action, status, data) {
    var text = action + " refused (HTTP " + status + (data && data.code ? " " + data.code : "") + ")";
    if (data && data.detail) { text += ": " + data.detail; }
    if (data && data.blockers && data.blockers.length) {
      text += " — blockers: " + data.blockers.map(function (b) { return b.key + " (" + b.reason + ")"; }).join(", ");
    }
    return text;
  }

  document.addEventListener("submit", function (event) {
    var form = event.target.closest ? event.target.closest("form[data-action]") : null;
    if (!form) { return; }
    event.preventDefault();
    if (form.getAttribute("data-confirm") && !window.confirm(form.getAttribute("data-confirm"))) { return; }
    var button = form.querySelector("button[type=submit]");
    var action = button ? button.textContent.trim() : "Action";
    var payload = {};
    Array.prototype.forEach.call(form.querySelectorAll("input[name]"), function (input) {
      if (input.name === "csrfmiddlewaretoken") { return; }
      payload[input.name] = input.getAttribute("data-type") === "bool" ? input.value === "true" : input.value;
    });
    if (button) { button.disabled = true; button.setAttribute("aria-busy", "true"); }
    fetch(form.action, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(payload)
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (response.ok) {
          showResult("ok", successText(action, response.status, data));
          if (!live.source) { refreshAll(); }
        } else {
          showResult("error", errorText(action, response.status, data));
        }
      });
    }).catch(function (error) {
      showResult("error", action + " failed: " + error.message);
    }).then(function () {
      if (button) { button.disabled = false; button.removeAttribute("aria-busy"); }
    });
  });

  document.addEventListener("click", function (event) {
    var toggle = event.target.closest ? event.target.closest("[data-live-toggle]") : null;
    if (!toggle) { return; }
    if (live.paused) { connect(); } else { disconnect(); }
  });

  if (body.getAttribute("data-live-stream")) { connect(); }
})();

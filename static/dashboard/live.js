// Palisade's live dashboard client: one websocket per screen, no third-party code.
// The server pushes {last_event_id, swaps: [{id, html}], leases: [[job, deadline, beat]]};
// each swap replaces the element with that id by the same partial the page rendered.
// Countdowns tick here from server-rendered deadlines (data-deadline / data-since, epoch ms).
(function () {
  "use strict";
  const body = document.body;
  const page = body.dataset.livePage;
  const status = document.getElementById("live-status");
  const skew = Date.now() - Number(body.dataset.serverNow || Date.now());
  let last = Number(body.dataset.lastEventId || 0), delay = 500, socket = null;

  function screen() {
    const s = { page: page, job: body.dataset.liveJob || "" };
    const table = document.getElementById("jobs-table");
    if (table) {
      s.query = table.dataset.query || "";
      s.first = table.dataset.firstPage || "1";
      s.ids = Array.from(table.querySelectorAll("tr[data-job]"), (r) => r.dataset.job).join(",");
    }
    return s;
  }
  function connect() {
    const params = new URLSearchParams(Object.assign(screen(), { since: last }));
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + "/ws/live/?" + params);
    socket.onopen = () => { delay = 500; setStatus("live", true); };
    socket.onmessage = (m) => apply(JSON.parse(m.data));
    socket.onclose = () => {
      setStatus("reconnecting", false);
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }
  function setStatus(text, on) {
    if (!status) return;
    status.textContent = text;
    status.className = "live-status " + (on ? "on" : "off");
  }
  function apply(msg) {
    (msg.swaps || []).forEach((s) => {
      const old = document.getElementById(s.id);
      if (!old) return;
      const tpl = document.createElement("template");
      tpl.innerHTML = s.html.trim();
      const fresh = tpl.content.firstElementChild;
      old.replaceWith(fresh);
      if (window.htmx) window.htmx.process(fresh);
    });
    (msg.leases || []).forEach(([job, deadline, beat]) => {
      document.querySelectorAll('[data-lease-job="' + job + '"]').forEach((e) => { e.dataset.deadline = deadline; });
      document.querySelectorAll('[data-beat-job="' + job + '"]').forEach((e) => { e.dataset.since = beat; });
    });
    if (msg.last_event_id) { last = Math.max(last, msg.last_event_id); body.dataset.lastEventId = last; }
    tick();
    // After the swaps: tests and bench/dashboard.py time a live update by this event.
    document.dispatchEvent(new CustomEvent("palisade:applied", { detail: { lastEventId: last, swaps: (msg.swaps || []).length } }));
  }
  function tick() {
    const now = Date.now() - skew;
    document.querySelectorAll("[data-deadline]").forEach((e) => {
      const left = (Number(e.dataset.deadline) - now) / 1000;
      if (!e.dataset.deadline) return;
      e.textContent = left >= 0 ? "expires in " + left.toFixed(1) + " s" : "expired " + (-left).toFixed(1) + " s ago";
      e.classList.toggle("expired", left < 0);
    });
    document.querySelectorAll("[data-since]").forEach((e) => {
      if (e.dataset.since) e.textContent = ((now - Number(e.dataset.since)) / 1000).toFixed(1) + " s";
    });
  }
  // An htmx swap of the job list (filter, page) changes what this screen shows: tell the server.
  body.addEventListener("htmx:afterSettle", () => {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ screen: screen() }));
  });
  setInterval(tick, 250);
  tick();
  if (page) connect();
})();

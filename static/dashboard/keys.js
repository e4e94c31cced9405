// Palisade dashboard: keyboard shortcuts, relative times and copy-as-JSON. No third-party code.
// ?  help   /  search jobs   j / k  next / previous row   Enter  open it
// g o overview   g j jobs   g q queues   g c cron   g w workers   g r rejected writes
// <time class="rel" data-at="epoch ms" title="exact ms"> shows "12.3 s ago", ticking.
// <button data-copy="element id"> copies that element's text (the JSON the page shows).
(function () {
  "use strict";
  const body = document.body;
  const skew = Date.now() - Number(body.dataset.serverNow || Date.now());
  const GO = { o: "urlOverview", j: "urlJobs", q: "urlQueues", c: "urlCron", w: "urlWorkers", r: "urlRejected" };
  let pendingG = 0, selectedKey = null;

  function typing(e) {
    const t = e.target;
    return t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
  }
  function help() {
    const dialog = document.getElementById("shortcuts");
    if (dialog && !dialog.open) dialog.showModal();
  }
  function search() {
    const box = document.getElementById("id_q");
    if (box) { box.focus(); box.select(); return; }
    location.href = body.dataset.urlJobs + "#search";
  }
  function rows() {
    const table = document.querySelector("table.nav-rows, #jobs-table");
    return table ? Array.from(table.querySelectorAll("tbody tr")).filter((r) => r.querySelector("a[href]")) : [];
  }
  function keyOf(row) {
    return row.dataset.job || row.dataset.queue || row.dataset.schedule || row.id || "";
  }
  function select(row) {
    rows().forEach((r) => { r.classList.remove("selected"); r.removeAttribute("aria-selected"); });
    if (!row) return;
    row.classList.add("selected");
    row.setAttribute("aria-selected", "true");
    row.scrollIntoView({ block: "nearest" });
    selectedKey = keyOf(row);
  }
  function move(step) {
    const all = rows();
    if (!all.length) return;
    const at = all.findIndex((r) => r.classList.contains("selected"));
    select(all[at < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(Math.max(at + step, 0), all.length - 1)]);
  }
  function open() {
    const row = rows().find((r) => r.classList.contains("selected"));
    const link = row && row.querySelector("a[href]");
    if (link) location.href = link.href;
  }
  // A live push or an htmx poll replaces rows: keep the operator's place.
  function reselect() {
    if (selectedKey === null) return;
    const row = rows().find((r) => keyOf(r) === selectedKey);
    if (row) { row.classList.add("selected"); row.setAttribute("aria-selected", "true"); }
  }
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e)) return;
    const now = Date.now();
    if (now - pendingG < 1500 && GO[e.key]) {
      pendingG = 0;
      e.preventDefault();
      location.href = body.dataset[GO[e.key]];
      return;
    }
    pendingG = 0;
    if (e.key === "?") { e.preventDefault(); help(); }
    else if (e.key === "/") { e.preventDefault(); search(); }
    else if (e.key === "j") move(1);
    else if (e.key === "k") move(-1);
    else if (e.key === "Enter" && rows().some((r) => r.classList.contains("selected"))) { e.preventDefault(); open(); }
    else if (e.key === "g") pendingG = now;
  });

  function relative(ms) {
    const s = (Date.now() - skew - ms) / 1000, a = Math.abs(s);
    let text;
    if (a < 1) return "just now";
    if (a < 60) text = a.toFixed(1) + " s";
    else if (a < 3600) text = Math.floor(a / 60) + " min " + Math.floor(a % 60) + " s";
    else if (a < 172800) text = Math.floor(a / 3600) + " h " + Math.floor((a % 3600) / 60) + " min";
    else text = Math.floor(a / 86400) + " d";
    return s >= 0 ? text + " ago" : "in " + text;
  }
  function tick() {
    document.querySelectorAll("time.rel[data-at]").forEach((t) => { t.textContent = relative(Number(t.dataset.at)); });
  }

  function copy(button) {
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    const text = source.textContent;
    const done = (ok) => {
      const label = button.dataset.label || (button.dataset.label = button.textContent);
      button.textContent = ok ? "copied" : "copy failed";
      setTimeout(() => { button.textContent = label; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(() => done(true), () => done(false));
      return;
    }
    const area = document.createElement("textarea");  // plain-http pages have no clipboard API
    area.value = text;
    document.body.appendChild(area);
    area.select();
    done(document.execCommand("copy"));
    area.remove();
  }
  document.addEventListener("click", (e) => {
    const button = e.target.closest && e.target.closest("button[data-copy]");
    if (button) copy(button);
    if (e.target.id === "help-button") help();
  });

  document.addEventListener("palisade:applied", () => { reselect(); tick(); });
  body.addEventListener("htmx:afterSwap", () => { reselect(); tick(); });
  if (location.hash === "#search") search();
  setInterval(tick, 1000);
  tick();
})();

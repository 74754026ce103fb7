// The Cascade console's only script (served from the node, no CDN, no
// build step). Pages are complete without it; with it, each element with
// `data-live="URL"` follows that URL's server-sent events: an `update`
// event carries the element's new HTML, rendered and escaped by the node;
// `problem` says why the last read failed; `done` ends the stream.
"use strict";

function follow(element) {
  const status = document.createElement("p");
  status.className = "live-status";
  status.setAttribute("aria-live", "polite");
  status.textContent = "live: connecting…";
  element.before(status);
  element.dataset.updates = "0";
  const source = new EventSource(element.dataset.live);
  source.addEventListener("update", (event) => {
    // Keep what the reader opened or closed in the tree across updates.
    const open = new Map();
    for (const d of element.querySelectorAll("details[data-key]")) {
      open.set(d.dataset.key, d.open);
    }
    element.innerHTML = event.data;
    for (const d of element.querySelectorAll("details[data-key]")) {
      if (open.has(d.dataset.key)) {
        d.open = open.get(d.dataset.key);
      }
    }
    element.dataset.updates = String(Number(element.dataset.updates) + 1);
    status.textContent = "live: updated " + new Date().toLocaleTimeString();
    status.classList.remove("stale");
  });
  source.addEventListener("problem", (event) => {
    status.textContent = "live: the last read failed: " + event.data + " (still trying)";
    status.classList.add("stale");
  });
  source.addEventListener("done", () => {
    source.close();
    element.dataset.done = "true";
    status.textContent = "finished: this is the final state";
  });
  source.onerror = () => {
    if (element.dataset.done !== "true") {
      status.textContent = "live: connection lost, reconnecting…";
      status.classList.add("stale");
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  for (const element of document.querySelectorAll("[data-live]")) {
    follow(element);
  }
});

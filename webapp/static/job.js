// The job page's progress bar: poll the job's progress (JSON) until it ends, then reload
// the page, which then shows the results. No inline script: the CSP allows only this file.
(function () {
  "use strict";
  var section = document.getElementById("progress");
  if (!section || section.dataset.final === "true") return;
  var url = section.dataset.progressUrl;
  var bar = document.getElementById("bar");
  var percent = document.getElementById("percent");
  var done = document.getElementById("done");
  var status = document.getElementById("status");
  var eta = document.getElementById("eta");
  var queue = document.getElementById("queue");

  function moment(iso) { return iso.slice(0, 19).replace("T", " ") + " UTC"; }

  // The job's place on its lane while chunks of it wait (the template's words), as text.
  function place(lane, q) {
    var chunks = q.waiting_chunks + " chunk" + (q.waiting_chunks !== 1 ? "s" : "");
    var text = "Waiting for a slot on the " + lane + " lane: " + chunks + " (" +
      q.waiting_items + " items), " + q.chunks_ahead + " ahead of the next one; " +
      "this account's share of the lane: " + (q.share * 100).toFixed(1) + " %. ";
    if (q.estimated_start) {
      text += "Estimated start " + moment(q.estimated_start) +
        (q.estimated_end ? ", end " + moment(q.estimated_end) : "") + ".";
    } else if (q.estimated_end) {
      text += "Estimated end " + moment(q.estimated_end) + ".";
    } else {
      text += "No estimate yet: nothing ended on the lane lately.";
    }
    return text;
  }

  function show(p) {
    bar.value = p.percent;
    bar.textContent = p.percent + " %";
    percent.textContent = p.percent + " %";
    done.textContent = p.done;
    status.textContent = p.status;
    status.className = "status-" + p.status;
    eta.textContent = p.eta_seconds === null ? "" : "about " + Math.round(p.eta_seconds) + " s left";
    queue.hidden = !p.queue;
    queue.textContent = p.queue ? place(section.dataset.lane, p.queue) : "";
  }

  // Every second at first, then every 3 s: polls count against the account's rate limit
  // (a demo account has 60 requests a minute). A 429 waits its Retry-After.
  var polls = 0;
  function next() { return ++polls <= 15 ? 1000 : 3000; }

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (r.ok) return r.json();
        var wait = parseInt(r.headers.get("Retry-After") || "0", 10);
        return Promise.reject(Math.max(wait * 1000, 3000));
      })
      .then(function (p) {
        show(p);
        if (p.final) {
          window.location.reload();
        } else {
          window.setTimeout(poll, next());
        }
      })
      .catch(function (wait) { window.setTimeout(poll, typeof wait === "number" ? wait : 3000); });
  }
  window.setTimeout(poll, 500);
})();

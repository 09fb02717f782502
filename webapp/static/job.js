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

  function show(p) {
    bar.value = p.percent;
    bar.textContent = p.percent + " %";
    percent.textContent = p.percent + " %";
    done.textContent = p.done;
    status.textContent = p.status;
    status.className = "status-" + p.status;
    eta.textContent = p.eta_seconds === null ? "" : "about " + Math.round(p.eta_seconds) + " s left";
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

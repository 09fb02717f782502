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

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (p) {
        show(p);
        if (p.final) {
          window.location.reload();
        } else {
          window.setTimeout(poll, 1000);
        }
      })
      .catch(function () { window.setTimeout(poll, 3000); });
  }
  window.setTimeout(poll, 500);
})();

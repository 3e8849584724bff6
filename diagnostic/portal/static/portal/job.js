// Keeps the job page's stage table fresh: fetches the stage fragment every few seconds
// and stops once the job has ended (the fragment then carries data-poll-ms="0").
(function () {
  "use strict";
  var box = document.getElementById("job-stages");
  if (!box) { return; }
  var url = box.getAttribute("data-poll-url");
  var every = parseInt(box.getAttribute("data-poll-ms"), 10) || 0;
  function poll() {
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        box.innerHTML = html;
        var done = box.querySelector("[data-terminal='1']");
        if (!done) { window.setTimeout(poll, every); }
      })
      .catch(function () { window.setTimeout(poll, every * 2); });
  }
  if (every > 0) { window.setTimeout(poll, every); }
})();

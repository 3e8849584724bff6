// The dashboard's live parts, without reloading the page: any element with data-poll-url
// is refreshed from that fragment every data-poll-ms (stopping once the fragment says the
// job, or the report version's render, ended), and a stage log with data-log-url is followed by appending what is new.
(function () {
  "use strict";
  function get(url) {
    return fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response;
      });
  }
  document.querySelectorAll("[data-poll-url]").forEach(function (box) {
    var url = box.getAttribute("data-poll-url");
    var every = parseInt(box.getAttribute("data-poll-ms"), 10) || 0;
    function poll() {
      get(url).then(function (r) { return r.text(); }).then(function (html) {
        box.innerHTML = html;
        if (!box.querySelector("[data-terminal='1']")) { window.setTimeout(poll, every); return; }
        // The job ended: the actions that no longer apply go, those for an ended job come,
        // and so does a message that said it was under way (a report version's render).
        document.querySelectorAll("[data-while-running], .flash.gone-when-ended").forEach(function (el) {
          el.hidden = true;
        });
        document.querySelectorAll("[data-when-ended]").forEach(function (el) { el.hidden = false; });
      }).catch(function () { window.setTimeout(poll, every * 2); });
    }
    if (every > 0) { window.setTimeout(poll, every); }
  });
  var log = document.getElementById("stage-log");
  if (log) {
    var every = parseInt(log.getAttribute("data-poll-ms"), 10) || 0;
    var next = parseInt(log.getAttribute("data-next"), 10) || 0;
    var state = document.getElementById("log-state");
    var progress = document.getElementById("log-progress");
    var follow = function () {
      get(log.getAttribute("data-log-url") + "&since=" + next).then(function (r) { return r.json(); })
        .then(function (data) {
          var atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
          if (data.reset) { log.textContent = data.text; } else if (data.text) { log.textContent += data.text; }
          next = data.next;
          if (data.text) {
            var empty = document.getElementById("log-empty");
            if (empty) { empty.remove(); }
          }
          if (state) { state.textContent = data.state; state.className = "badge " + data.status; }
          if (progress) { progress.textContent = data.running && data.status === "running" ? data.progress + " %" : ""; }
          if (atBottom) { window.scrollTo(0, document.body.scrollHeight); }
          if (data.running) { window.setTimeout(follow, every); }
        }).catch(function () { window.setTimeout(follow, every * 2); });
    };
    if (every > 0) { window.setTimeout(follow, every); }
  }
})();

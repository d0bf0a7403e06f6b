// genfleet status page: swaps in the server's fresh fragment every few seconds. The server escapes
// every value it puts in the fragment (genfleet/status/page_view.py); nothing here builds markup
// from data, and errors are shown as text.
(function () {
  "use strict";
  var content = document.getElementById("content");
  var live = document.getElementById("live");
  var period = Number(document.body.dataset.refreshMs) || 3000;
  var busy = false;

  function show(text, ok) {
    live.textContent = text;
    live.className = ok ? "ok" : "bad";
  }

  function refresh() {
    if (busy) { return; }
    busy = true;
    fetch("fragment", { cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        return response.text().then(function (body) {
          if (!response.ok) { throw new Error(body || ("HTTP " + response.status)); }
          content.innerHTML = body;
          show("live · " + new Date().toLocaleTimeString(), true);
        });
      })
      .catch(function (error) { show("not updating: " + error.message, false); })
      .then(function () { busy = false; });
  }

  setInterval(refresh, period);
})();

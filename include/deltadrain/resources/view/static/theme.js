// The view is shown in a frame of Airflow's UI: take Airflow's light or dark theme from the parent
// page (its <html> class), and follow it when the user switches. Alone (no Airflow around it), the
// page's CSS follows the browser's prefers-color-scheme.
(function () {
  var root = document.documentElement;
  function parentRoot() {
    try {
      var p = window.parent && window.parent !== window ? window.parent.document.documentElement : null;
      return p && p !== root ? p : null;
    } catch (e) { return null; }  // another origin: keep prefers-color-scheme
  }
  function apply() {
    var p = parentRoot();
    var mode = p ? (p.classList.contains("dark") ? "dark" : p.classList.contains("light") ? "light"
                    : (p.style.colorScheme || "")) : "";
    if (mode === "dark" || mode === "light") { root.setAttribute("data-theme", mode); }
    else { root.removeAttribute("data-theme"); }
  }
  apply();
  var p = parentRoot();
  if (p) { root.setAttribute("data-framed", ""); }  // transparent over Airflow's own background
  if (p && window.MutationObserver) {
    new MutationObserver(apply).observe(p, { attributes: true, attributeFilter: ["class", "style"] });
  }
})();

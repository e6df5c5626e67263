// The site's only script. It reads chart data with JSON.parse from inert <script type="application/json"> blocks
// and shows or hides blocks the page already holds; it never turns data into markup.
"use strict";
document.querySelectorAll("div[data-chart]").forEach(function (div) {
  var spec = JSON.parse(document.getElementById(div.dataset.chart).textContent);
  Plotly.newPlot(div, spec.data, spec.layout, {displaylogo: false, responsive: true});
});
document.querySelectorAll("select.compare").forEach(function (select) {
  select.addEventListener("change", function () {
    select.parentElement.querySelectorAll("div.group").forEach(function (group) {
      group.hidden = group.dataset.group !== select.value;
    });
  });
});

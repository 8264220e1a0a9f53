/* nightlab dashboard: live updates of #live and the uPlot charts. No dependencies but uPlot. */
(function () {
  "use strict";
  const PALETTE = ["#2f6fd6", "#d6862f", "#8e44ad", "#16a085", "#c0392b", "#7f8c8d"];

  // ------------------------------------------------------------------ live fragment polling
  const live = document.getElementById("live");
  const conn = document.getElementById("conn");

  function setConn(ok) {
    if (!conn) return;
    conn.textContent = ok ? "live" : "offline: retrying";
    conn.classList.toggle("off", !ok);
  }

  if (live) {
    const interval = Number(live.dataset.interval) || 3000;
    let version = live.dataset.version || "";
    let polls = 0;
    const tick = async function () {
      try {
        const url = new URL(window.location.href);
        url.searchParams.set("partial", "1");
        // `since` lets the server answer 204 while nothing changed; every 10th poll asks for
        // the fragment anyway, for what moves without an event (efficiency, elapsed times)
        polls += 1;
        if (version && polls % 10 !== 0) url.searchParams.set("since", version);
        const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
        if (response.status === 200) {
          // the fragment is rendered (and escaped) by the server's templates; elements marked
          // data-keep (charts) stay as they are, in the place the new fragment gives them
          const kept = Array.from(live.querySelectorAll("[data-keep][id]"));
          live.innerHTML = await response.text();
          kept.forEach(function (el) {
            const slot = document.getElementById(el.id);
            if (slot && slot !== el) slot.replaceWith(el);
          });
          const next = response.headers.get("X-Nightlab-Version") || "";
          if (next !== version) document.dispatchEvent(new CustomEvent("nightlab:changed"));
          version = next;
        }
        setConn(response.status === 200 || response.status === 204);
      } catch (err) {
        setConn(false);
      }
      window.setTimeout(tick, interval);
    };
    window.setTimeout(tick, interval);
  }

  async function getJSON(src) {
    const response = await fetch(src, { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) throw new Error(src + ": " + response.status);
    return response.json();
  }

  function fmt(v, digits) {
    return v == null ? "-" : Number(v).toFixed(digits);
  }

  // ------------------------------------------------------------------ progress chart
  function tooltipPlugin(points, metric) {
    let tip;
    return {
      hooks: {
        init: function (u) {
          tip = document.createElement("div");
          tip.className = "tooltip";
          u.over.appendChild(tip);
          u.over.addEventListener("click", function () {
            const i = u.cursor.idx;
            if (i != null && points[i]) window.location.href = "/experiments/" + encodeURIComponent(points[i].id);
          });
          u.over.addEventListener("mouseleave", function () { tip.style.display = "none"; });
        },
        setCursor: function (u) {
          const i = u.cursor.idx;
          const p = i == null ? null : points[i];
          if (!p) { tip.style.display = "none"; return; }
          // textContent only: descriptions are untrusted text
          tip.replaceChildren();
          const head = document.createElement("b");
          head.textContent = p.id + " · " + p.tier + " · " + metric + " " + fmt(p.y, 6);
          tip.appendChild(head);
          if (p.kept || p.verdict) {
            const k = document.createElement("span");
            k.className = p.kept ? "kept" : "verdict";
            k.textContent = p.kept ? " kept" : " " + p.verdict;
            tip.appendChild(k);
          }
          const desc = document.createElement("div");
          desc.textContent = p.description;
          tip.appendChild(desc);
          const left = u.valToPos(p.t, "x");
          const top = u.valToPos(p.y, "y");
          tip.style.display = "block";
          tip.style.left = Math.min(left + 12, u.over.clientWidth - 200) + "px";
          tip.style.top = Math.max(top - 40, 0) + "px";
        },
      },
    };
  }

  function WITHIN(p) { return p.verdict === "within-noise"; }

  function progressOptions(el, data) {
    const series = [{ label: "finished" }];
    const columns = [data.points.map(function (p) { return p.t; })];
    data.tiers.forEach(function (tier, n) {
      const color = PALETTE[n % PALETTE.length];
      let best = null;
      columns.push(
        data.points.map(function (p) { return p.tier === tier && !p.kept && !WITHIN(p) ? p.y : null; }),
        data.points.map(function (p) { return p.tier === tier && !p.kept && WITHIN(p) ? p.y : null; }),
        data.points.map(function (p) { return p.tier === tier && p.kept ? p.y : null; }),
        data.points.map(function (p) { if (p.tier === tier && p.best != null) best = p.best; return best; })
      );
      series.push(
        { label: tier + " runs", stroke: color, paths: function () { return null; },
          points: { show: true, size: 5, width: 1, stroke: color, fill: color + "40" } },
        // within noise is neither kept nor discarded: amber, as in progress.png
        { label: tier + " within noise", stroke: "#e9a23b", paths: function () { return null; },
          points: { show: true, size: 8, width: 1.5, stroke: "#e9a23b", fill: "#e9a23b80" } },
        { label: tier + " kept", stroke: "#1d6b34", paths: function () { return null; },
          points: { show: true, size: 10, width: 1.5, stroke: "#1d6b34", fill: "#2a9d4b" } },
        { label: tier + " incumbent (mean)", stroke: color, width: 2, spanGaps: true,
          paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } }
      );
    });
    const opts = {
      width: Math.max(el.clientWidth, 320),
      height: 340,
      series: series,
      scales: { x: { time: true } },
      axes: [{}, { label: data.metric + " (" + data.direction + " is better)", size: 70 }],
      cursor: { points: { show: false } },
      legend: { live: false },
      plugins: [tooltipPlugin(data.points, data.metric)],
    };
    return [opts, columns];
  }

  function mountChart(el, build) {
    let plot = null;
    const draw = async function () {
      let data;
      try {
        data = await getJSON(el.dataset.src);
      } catch (err) {
        return;
      }
      const built = build(el, data);
      if (plot) plot.destroy();
      el.replaceChildren();
      if (!built) {
        const empty = document.createElement("p");
        empty.className = "muted";
        empty.textContent = "nothing to plot yet";
        el.appendChild(empty);
        el.dataset.points = "0";
        return;
      }
      plot = new uPlot(built[0], built[1], el);
      el.dataset.points = String(built[1][0].length);
      el.dataset.draws = String(Number(el.dataset.draws || 0) + 1);
    };
    draw();
    document.addEventListener("nightlab:changed", draw);
    window.addEventListener("resize", function () {
      if (plot) plot.setSize({ width: Math.max(el.clientWidth, 320), height: plot.height });
    });
  }

  const progress = document.getElementById("progress-chart");
  if (progress) {
    mountChart(progress, function (el, data) {
      return data.points.length ? progressOptions(el, data) : null;
    });
  }

  // ------------------------------------------------------------------ effects chart (wave page)
  const effects = document.getElementById("effects-chart");
  if (effects) {
    mountChart(effects, function (el, data) {
      const fx = data.effects;
      if (!fx || fx.intercept == null) return null;
      const mains = fx.terms.filter(function (t) { return t.term.indexOf(":") < 0; });
      if (!mains.length) return null;
      const series = [{ label: "level" }];
      const columns = [[-1, 1]];
      mains.forEach(function (t, n) {
        const color = PALETTE[n % PALETTE.length];
        series.push({ label: t.term, stroke: color, width: 2, points: { show: true, size: 7, fill: color } });
        columns.push([fx.intercept - t.coefficient, fx.intercept + t.coefficient]);
      });
      const opts = {
        width: Math.max(el.clientWidth, 320),
        height: 300,
        series: series,
        scales: { x: { time: false, range: [-1.2, 1.2] } },
        legend: { live: false },
        axes: [
          { values: function (u, ticks) { return ticks.map(function (v) { return v === -1 ? "low" : v === 1 ? "high" : ""; }); },
            splits: function () { return [-1, 1]; } },
          { label: data.metric, size: 70 },
        ],
      };
      return [opts, columns];
    });
  }
})();

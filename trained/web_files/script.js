// The page's behaviour: ask the server (trained/web.py) for a translation and draw what it sends
// back. Everything shown is computed by the server from the model; this file only lays it out.
"use strict";

const KINDS = { cross: "decoder over the source", encoder: "encoder self-attention", decoder: "decoder self-attention" };

function element(tag, attributes = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function colour(weight) {  // one scale from 0 (white) to 1 (dark blue), as the project's pictures
  return `rgba(8, 48, 107, ${Math.min(Math.max(weight, 0), 1).toFixed(3)})`;
}

function say(text) {
  const message = document.getElementById("message");
  message.textContent = text;
  message.hidden = !text;
}

function hypothesesTable(hypotheses) {
  const head = element("tr", {}, ["score", "log-probability", "length penalty", "hypothesis"].map(
    (name) => element("th", { text: name })));
  const rows = hypotheses.map((h) => element("tr", { class: h.returned ? "returned" : "" }, [
    element("td", { class: "number", text: h.score.toFixed(3) }),
    element("td", { class: "number", text: h.log_prob.toFixed(3) }),
    element("td", { class: "number", text: h.penalty.toFixed(3) }),
    element("td", { text: h.text + (h.returned ? "   ← returned" : "") }),
  ]));
  return element("table", { class: "hypotheses" }, [element("thead", {}, [head]), element("tbody", {}, rows)]);
}

function attentionView(maps) {
  const kind = element("select", { class: "kind", "aria-label": "attention" },
    Object.entries(KINDS).map(([value, label]) => element("option", { value, text: label })));
  const layers = Math.max(...maps.map((m) => m.layer));
  const layer = element("select", { class: "layer", "aria-label": "layer" },
    Array.from({ length: layers }, (_, i) => element("option", { value: i + 1, text: `layer ${i + 1}` })));
  layer.value = layers;
  const heads = maps[0].heads.length - 1;
  const head = element("select", { class: "head", "aria-label": "head" },
    [element("option", { value: heads, text: "mean of the heads" }),
     ...Array.from({ length: heads }, (_, i) => element("option", { value: i, text: `head ${i + 1}` }))]);
  const strip = element("div", { class: "strip" });
  const legend = element("p", { class: "legend" });
  const table = element("table", { class: "heatmap" });
  let lit = null;

  function light(map, weights, row) {
    lit = row;
    for (const tr of table.querySelectorAll("tbody tr")) tr.classList.toggle("lit", Number(tr.dataset.row) === row);
    strip.replaceChildren(...map.columns.map((piece, j) => element("span", {
      text: piece, title: `${map.rows[row]} → ${piece}: ${weights[row][j].toFixed(3)}`,
      style: `background: ${colour(weights[row][j])}; color: ${weights[row][j] > 0.5 ? "white" : "black"}`,
    })));
    legend.textContent = `what “${map.rows[row]}” (row ${row + 1}) attends to, darker for more weight; ` +
      "hover or click another row of the map";
  }

  function draw() {
    const map = maps.find((m) => m.kind === kind.value && m.layer === Number(layer.value));
    const weights = map.heads[Number(head.value)];
    const corner = element("th", { text: "" });
    const header = element("tr", {}, [corner, ...map.columns.map((piece) => element("th", { text: piece }))]);
    const body = map.rows.map((piece, i) => {
      const tr = element("tr", { "data-row": i }, [element("th", { text: piece }), ...weights[i].map((w, j) =>
        element("td", { class: "cell", style: `background: ${colour(w)}`,
                        title: `${piece} → ${map.columns[j]}: ${w.toFixed(3)}` }))]);
      tr.addEventListener("mouseenter", () => light(map, weights, i));
      tr.addEventListener("click", () => light(map, weights, i));
      return tr;
    });
    table.replaceChildren(element("thead", {}, [header]), element("tbody", {}, body));
    light(map, weights, lit !== null && lit < map.rows.length ? lit : 0);
  }

  for (const picker of [kind, layer, head]) picker.addEventListener("change", draw);
  const view = element("div", {}, [element("div", { class: "pickers" }, [kind, layer, head]), strip, legend,
    element("div", { class: "legend", text: "rows: the pieces that attend; columns: the pieces attended to; " +
      "each row's weights sum to 1 (white 0, dark blue 1)" }), table]);
  draw();
  return view;
}

function runView(run) {
  return element("section", { class: "run" }, [
    element("h2", { text: run.name }),
    ...run.notes.map((note) => element("p", { class: "note", text: note })),
    element("p", { class: "translation", text: run.translation }),
    element("h3", { text: "Finished hypotheses (score = log-probability / length penalty)" }),
    hypothesesTable(run.hypotheses),
    element("h3", { text: "Attention" }),
    attentionView(run.maps),
    element("h3", { text: "The beam, step by step (the returned path in red)" }),
    element("div", { class: "tree" }, [element("img", { src: `data:image/png;base64,${run.tree}`,
                                                          alt: "the beam search as a tree" })]),
  ]);
}

async function translate(event) {
  event.preventDefault();
  const busy = document.getElementById("busy");
  const button = document.getElementById("translate");
  busy.hidden = false;
  button.disabled = true;
  say("");
  try {
    const response = await fetch("/api/translate", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text: document.getElementById("text").value,
                             beam_size: document.getElementById("beam_size").value,
                             alpha: document.getElementById("alpha").value }),
    });
    const answer = await response.json();
    const results = document.getElementById("results");
    if (answer.error) {
      results.replaceChildren();
      say(answer.error);
    } else {
      results.replaceChildren(...answer.runs.map(runView));
    }
  } catch (error) {
    say(`no answer from the server (${error}): is page.py still running?`);
  } finally {
    busy.hidden = true;
    button.disabled = false;
  }
}

async function start() {
  const described = await (await fetch("/api/runs")).json();
  const first = described.runs[0];
  document.getElementById("beam_size").value = first.beam_size;
  document.getElementById("beam_size").max = described.max_beam;
  document.getElementById("alpha").value = first.alpha;
  document.getElementById("runs-line").textContent = described.runs.map(
    (r) => `${r.name} (its own decoding: beam ${r.beam_size}, α ${r.alpha})`).join(" · ") +
    "; all decode as set below";
  document.getElementById("form").addEventListener("submit", translate);
  document.body.dataset.ready = "yes";
}

start();

// Building the page from data, without ever parsing a string as HTML: every text goes in as a
// text node (the Content-Security-Policy forbids HTML sinks outright, see console.py).

/** h("a", { class: "x", href: "#", on: { click: fn } }, "text", child, [more]) */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = Array.isArray(value) ? value.filter(Boolean).join(" ") : value;
    else if (key === "on") for (const [name, fn] of Object.entries(value)) el.addEventListener(name, fn);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key in el && typeof value !== "string") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace everything inside `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A table: columns [{ title, cell(row) -> node|string, class }], wrapped so it scrolls
 * sideways on a narrow screen instead of squeezing. */
export function table(columns, rows, { empty = "Nothing to show.", caption } = {}) {
  if (!rows.length) return h("p", { class: "muted empty" }, empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      {},
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.title)))),
      h(
        "tbody",
        {},
        rows.map((row) => h("tr", {}, columns.map((c) => h("td", { class: c.class, "data-label": c.title }, c.cell(row))))),
      ),
    ),
  );
}

/** A labelled figure: "Pending  1,234  tasks". */
export function figure(label, value, note) {
  return h("div", { class: "figure" }, h("div", { class: "label" }, label), h("div", { class: "value" }, value), note ? h("div", { class: "note" }, note) : null);
}

/** A coloured status word. */
export function badge(text, kind = text) {
  return h("span", { class: ["badge", `badge-${kind}`] }, text);
}

/** A message above a view's content. */
export function notice(text, kind = "info") {
  return h("p", { class: ["notice", kind], role: kind === "error" ? "alert" : "status" }, text);
}

// Tasks: filter by status, type, label and worker; newest first, a page at a time (keyset: the
// "Older" link carries the cursor); bulk retry of the failures (and bulk cancel of the pending
// tasks) the filters select, for the admin role.

import { badge, h, notice, replace, table } from "../dom.js";
import { buildFragment } from "../fragment.js";
import { formatAgo, plural } from "../format.js";
import { STATUSES, bulkFilter, describeFilter, listQuery } from "../model.js";

const PAGE_SIZE = 50;
const REFRESH_MS = 5000;
const FILTERS = ["status", "type", "label", "worker"];

function filterForm(ctx) {
  const p = ctx.params;
  const field = (name, label, input) => h("div", { class: "field" }, h("label", { for: `filter-${name}` }, label), input);
  const text = (name, placeholder) => h("input", { id: `filter-${name}`, name, value: p[name] || "", placeholder, autocomplete: "off" });
  const status = h(
    "select",
    { id: "filter-status", name: "status" },
    h("option", { value: "" }, "any"),
    STATUSES.map((s) => h("option", { value: s, selected: p.status === s }, s)),
  );
  return h(
    "form",
    {
      class: "filters",
      on: {
        submit: (event) => {
          event.preventDefault();
          const data = new FormData(event.target);
          const next = {};
          for (const name of FILTERS) next[name] = String(data.get(name) || "").trim();
          ctx.navigate("tasks", next);
        },
      },
    },
    field("status", "Status", status),
    field("type", "Type", text("type", "e.g. demo.echo")),
    field("label", "Label", text("label", "e.g. tenant-a")),
    field("worker", "Worker", text("worker", "worker id")),
    h("div", { class: "field actions" }, h("button", { type: "submit", id: "apply-filters" }, "Show"), h("a", { href: buildFragment("tasks") }, "Clear")),
  );
}

function bulkActions(ctx, message) {
  if (ctx.role !== "admin") return null;
  const actions = [
    ["failed", "retry", "Retry", "retried"],
    ["pending", "cancel", "Cancel", "cancelled"],
  ];
  const buttons = [];
  for (const [status, action, verb, answer] of actions) {
    if (ctx.params.status !== status) continue;
    const body = bulkFilter(ctx.params, status);
    if (!body) {
      buttons.push(h("p", { class: "muted" }, `Bulk ${action} does not filter by worker: clear the worker filter to ${action} these tasks together.`));
      continue;
    }
    buttons.push(
      h(
        "button",
        {
          type: "button",
          id: `bulk-${action}`,
          class: action === "cancel" ? "danger" : null,
          on: {
            click: async () => {
              if (!window.confirm(`${verb} ${describeFilter(body)}?`)) return;
              try {
                const result = await ctx.api.post(`/tasks/${action}`, body);
                replace(message, notice(`${verb === "Retry" ? "Retried" : "Cancelled"} ${plural(result[answer], "task")}.`, "success"));
              } catch (error) {
                replace(message, notice(error.message, "error"));
              }
              await ctx.redraw();
            },
          },
        },
        `${verb} every ${status} task matching these filters`,
      ),
    );
  }
  return buttons.length ? h("div", { class: "bulk" }, buttons) : null;
}

function taskTable(tasks, now) {
  return table(
    [
      { title: "ID", cell: (t) => h("a", { href: buildFragment("task", { id: t.id }), class: "task-link" }, String(t.id)) },
      { title: "Type", cell: (t) => t.type },
      { title: "Status", cell: (t) => badge(t.status) },
      { title: "Attempts", class: "num", cell: (t) => `${t.attempts} of ${t.max_attempts}` },
      { title: "Labels", cell: (t) => t.labels.join(", ") || "—" },
      { title: "Created", cell: (t) => formatAgo(t.created_at, now) },
      { title: "Worker", cell: (t) => t.worker_id || "—" },
      { title: "Last error", class: "error-text", cell: (t) => (t.last_error ? t.last_error.slice(0, 120) : "—") },
    ],
    tasks,
    { empty: "No task matches these filters." },
  );
}

export default {
  id: "tasks",
  title: "Tasks",
  admin: false,
  async render(ctx) {
    const message = h("div", { class: "messages" });
    const list = h("div", { class: "task-list" });
    replace(ctx.root, h("h1", {}, "Tasks"), filterForm(ctx), message, list);
    ctx.redraw = async () => {
      const page = await ctx.api.get("/tasks", listQuery(ctx.params, PAGE_SIZE));
      if (!ctx.live) return;
      const older = page.next_cursor ? h("a", { href: buildFragment("tasks", { ...ctx.params, cursor: page.next_cursor }), id: "older" }, "Older tasks →") : null;
      const newest = ctx.params.cursor ? h("a", { href: buildFragment("tasks", { ...ctx.params, cursor: "" }) }, "← Newest tasks") : null;
      replace(
        list,
        bulkActions(ctx, message),
        h("p", { class: "muted" }, `${plural(page.tasks.length, "task")} on this page, newest first.`),
        taskTable(page.tasks, Date.now()),
        h("nav", { class: "pager", "aria-label": "Pages" }, newest, older),
      );
    };
    await ctx.redraw();
    // The first page follows the queue as it moves; an older page stays put.
    if (!ctx.params.cursor) ctx.every(REFRESH_MS, ctx.redraw);
  },
};

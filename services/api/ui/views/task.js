// One task: its payload, result, error and attempts; retry and cancel for the admin role.

import { badge, h, notice, replace } from "../dom.js";
import { buildFragment } from "../fragment.js";
import { formatAgo, formatJson, formatTime } from "../format.js";
import { laneOf } from "../model.js";

const REFRESH_MS = 3000;
const FINISHED_REFRESH_MS = 30000;

function when(iso, now) {
  return iso ? `${formatTime(iso)} (${formatAgo(iso, now)})` : "—";
}

function details(task, now) {
  const rows = [
    ["Status", badge(task.status)],
    ["Type", task.type],
    ["Lane", `${laneOf(task.priority)} (priority ${task.priority}, weight ${task.weight})`],
    ["Labels", task.labels.join(", ") || "—"],
    ["Attempts", `${task.attempts} of ${task.max_attempts}`],
    ["Created", when(task.created_at, now)],
    ["Due", when(task.run_after, now)],
    ["Started", when(task.started_at, now)],
    ["Finished", when(task.finished_at, now)],
    ["Worker", task.worker_id ? h("a", { href: buildFragment("tasks", { worker: task.worker_id }) }, task.worker_id) : "—"],
    ["Lease expires", when(task.lease_expires_at, now)],
    ["Timeout", task.timeout_seconds ? `${task.timeout_seconds} s per attempt` : "none"],
    ["Unique key", task.unique_key || "—"],
    ["Cancel requested", task.cancel_requested ? "yes" : "no"],
  ];
  return h("dl", { class: "details" }, rows.map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

function block(title, value, kind) {
  return h("section", {}, h("h2", {}, title), h("pre", { class: ["json", kind] }, value));
}

export default {
  id: "task",
  title: "Task",
  admin: false,
  async render(ctx) {
    const id = Number(ctx.params.id);
    if (!Number.isInteger(id) || id < 1) {
      replace(ctx.root, h("h1", {}, "Task"), notice("No task id in the link.", "error"));
      return;
    }
    const message = h("div", { class: "messages" });
    const act = async (action) => {
      try {
        await ctx.api.post(`/tasks/${id}/${action}`);
        replace(message, notice(action === "retry" ? "Back in the queue, from attempt 0." : "Cancelled (a running task stops at its worker's next heartbeat).", "success"));
      } catch (error) {
        replace(message, notice(error.message, "error"));
      }
      await draw();
    };
    let finished = false;
    let drawnAt = 0;
    const draw = async () => {
      const task = await ctx.api.get(`/tasks/${id}`);
      drawnAt = Date.now();
      finished = ["completed", "failed", "cancelled"].includes(task.status);
      if (!ctx.live) return;
      const now = Date.now();
      const buttons = [];
      if (ctx.role === "admin" && ["failed", "cancelled"].includes(task.status)) {
        buttons.push(h("button", { type: "button", id: "retry", on: { click: () => act("retry") } }, "Retry"));
      }
      if (ctx.role === "admin" && ["pending", "running"].includes(task.status)) {
        buttons.push(h("button", { type: "button", id: "cancel", class: "danger", on: { click: () => act("cancel") } }, "Cancel"));
      }
      replace(
        ctx.root,
        h("p", {}, h("a", { href: buildFragment("tasks") }, "← Tasks")),
        h("h1", {}, `Task ${task.id}`, " ", badge(task.status)),
        message,
        buttons.length ? h("div", { class: "actions" }, buttons) : null,
        details(task, now),
        block("Payload", formatJson(task.payload)),
        block("Result", formatJson(task.result)),
        block("Last error", task.last_error || "—", task.last_error ? "error-text" : null),
      );
    };
    const refresh = async () => {
      // A finished task changes only if someone retries it: its payload and result (up to
      // about 1.25 MB) are fetched again every FINISHED_REFRESH_MS, not every REFRESH_MS.
      if (finished && Date.now() - drawnAt < FINISHED_REFRESH_MS) return;
      await draw();
    };
    await draw();
    ctx.every(REFRESH_MS, refresh);
  },
};

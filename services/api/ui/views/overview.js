// Overview: the queue per lane and group, recent outcomes, the strict cap in use and the fleet,
// refreshed every few seconds.

import { figure, h, notice, replace, table } from "../dom.js";
import { buildFragment } from "../fragment.js";
import { formatCount, formatDuration, formatPercent, formatTime, plural } from "../format.js";
import { LANES, fleetSummary } from "../model.js";

const REFRESH_MS = 5000;

const LANE_NAMES = {
  control: "Control (config changes)",
  strict: "Strict (priority above 0)",
  normal: "Normal (priority 0, shared by group)",
};

function queueFigures(stats) {
  const s = stats.by_status;
  const about = (status) => (stats.estimated.includes(status) ? "about " : "");
  const done = stats.finished_last_minute;
  // A count that reached the API's limit stopped there: "10,000+", not an exact figure.
  const capped = new Set(stats.finished_capped || []);
  const count = (name, n) => `${formatCount(n)}${capped.has(name) ? "+" : ""}`;
  return h(
    "div",
    { class: "figures" },
    figure("Waiting", `${about("pending")}${plural(s.pending, "task")}`, h("a", { href: buildFragment("tasks", { status: "pending" }) }, "see them")),
    figure("Running", plural(s.running, "task"), h("a", { href: buildFragment("tasks", { status: "running" }) }, "see them")),
    figure("Completed", `${count("completed", done.completed)} / min`, "in the last minute"),
    figure("Failed", `${count("failed", done.failed)} / min`, "in the last minute"),
    figure("Failed in the last hour", `${count("failed_last_hour", stats.failed_last_hour)} ${stats.failed_last_hour === 1 ? "task" : "tasks"}`, h("a", { href: buildFragment("tasks", { status: "failed" }) }, "see the failures")),
    figure("Cancelled", `${count("cancelled", done.cancelled)} / min`, "in the last minute"),
  );
}

function laneTable(stats) {
  return table(
    [
      { title: "Lane", cell: (lane) => LANE_NAMES[lane] },
      { title: "Waiting", class: "num", cell: (lane) => (stats.lanes[lane].pending_exact ? "" : "more than ") + plural(stats.lanes[lane].pending, "task") },
      { title: "Running", class: "num", cell: (lane) => plural(stats.lanes[lane].running, "task") },
      { title: "Longest wait of a due task", class: "num", cell: (lane) => formatDuration(stats.lanes[lane].oldest_ready_seconds) },
    ],
    LANES,
  );
}

function groupTable(stats) {
  return [
    table(
      [
        { title: "Group", cell: (g) => (g.group === "default" ? "default (no weighted label)" : g.group) },
        { title: "Weight", class: "num", cell: (g) => formatCount(g.weight) },
        { title: "Waiting", class: "num", cell: (g) => plural(g.pending, "task") },
        { title: "Due now", class: "num", cell: (g) => plural(g.ready, "task") },
        { title: "Longest wait", class: "num", cell: (g) => formatDuration(g.oldest_ready_seconds) },
      ],
      stats.groups,
    ),
    stats.sample_complete ? null : h("p", { class: "muted" }, "Counted over the oldest waiting tasks only: the backlog is longer than the console reads at once."),
  ];
}

function fleetFigures(fleet) {
  if (!fleet) {
    return h("p", { class: "muted" }, "Sign in with an admin token to see the workers, the strict cap and the config version.");
  }
  const lag = fleet.lagging.length
    ? h("a", { href: buildFragment("workers") }, `${plural(fleet.lagging.length, "worker")} behind: ${fleet.lagging.join(", ")}`)
    : "every alive worker runs it";
  return h(
    "div",
    { class: "figures" },
    figure("Alive workers", plural(fleet.alive, "worker"), `${plural(fleet.slots, "slot")}, ${formatCount(fleet.inflight)} busy`),
    figure(
      "Strict cap in use",
      `${formatCount(fleet.strictInflight)} of ${formatCount(fleet.strictCap)}`,
      `strict share ${fleet.maxStrictPercentage} % (${formatPercent(fleet.strictCap, fleet.slots)} of the slots)`,
    ),
    figure("Config version", h("a", { href: buildFragment("config") }, String(fleet.version)), lag),
  );
}

export default {
  id: "overview",
  title: "Overview",
  admin: false,
  async render(ctx) {
    const draw = async () => {
      const stats = await ctx.api.get("/tasks/stats");
      let fleet = null;
      if (ctx.role === "admin") {
        const [workers, config] = await Promise.all([ctx.api.get("/workers"), ctx.api.get("/runtime-config")]);
        fleet = fleetSummary(workers.workers, config);
      }
      if (!ctx.live) return;
      replace(
        ctx.root,
        h("h1", {}, "Overview"),
        h("p", { class: "muted updated" }, `Updated ${formatTime(new Date().toISOString())}; refreshes every ${REFRESH_MS / 1000} s.`),
        stats.estimated.length ? notice(`Counts of ${stats.estimated.join(", ")} tasks are estimates: there are more than 10,000.`) : null,
        h("section", {}, h("h2", {}, "Tasks"), queueFigures(stats)),
        h("section", {}, h("h2", {}, "Lanes"), laneTable(stats)),
        h("section", {}, h("h2", {}, "Normal-lane groups"), groupTable(stats)),
        h("section", {}, h("h2", {}, "Fleet"), fleetFigures(fleet)),
      );
    };
    await draw();
    ctx.every(REFRESH_MS, draw);
  },
};

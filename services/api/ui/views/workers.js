// Workers: every registered worker, alive, draining or offline, with its load per lane and the
// config version it applied (those behind the latest are marked).

import { badge, h, replace, table } from "../dom.js";
import { formatAgo, formatCount, plural } from "../format.js";
import { fleetSummary, workerRows } from "../model.js";

const REFRESH_MS = 5000;

export default {
  id: "workers",
  title: "Workers",
  admin: true,
  async render(ctx) {
    const draw = async () => {
      const [list, config] = await Promise.all([ctx.api.get("/workers"), ctx.api.get("/runtime-config")]);
      if (!ctx.live) return;
      const rows = workerRows(list.workers, config.version);
      const fleet = fleetSummary(list.workers, config);
      const now = Date.now();
      const columns = [
        { title: "Worker", cell: (w) => h("span", { class: "worker-id" }, w.id) },
        { title: "State", cell: (w) => badge(w.state) },
        { title: "Slots", class: "num", cell: (w) => formatCount(w.concurrency) },
        { title: "Running (strict / normal)", class: "num", cell: (w) => `${w.strictInflight} / ${w.normalInflight}` },
        {
          title: "Config version",
          class: "num",
          cell: (w) => (w.lagging ? h("span", { class: "lagging" }, `${w.appliedVersion} (behind ${config.version})`) : String(w.appliedVersion)),
        },
        { title: "Last heartbeat", cell: (w) => formatAgo(w.lastHeartbeat, now) },
        { title: "Host", cell: (w) => w.host },
      ];
      if (rows.some((w) => w.tags)) columns.push({ title: "Tags", cell: (w) => (w.tags || []).join(", ") || "—" });
      if (rows.some((w) => w.taskTypes)) columns.push({ title: "Task types", cell: (w) => (w.taskTypes || []).join(", ") || "—" });
      replace(
        ctx.root,
        h("h1", {}, "Workers"),
        h(
          "p",
          { class: "summary" },
          `${plural(fleet.alive, "alive worker")} with ${plural(fleet.slots, "slot")}, ${formatCount(fleet.inflight)} busy. Config version ${fleet.version}: `,
          fleet.lagging.length ? h("span", { class: "lagging" }, `${plural(fleet.lagging.length, "worker")} behind`) : "every alive worker runs it",
          ".",
        ),
        table(columns, rows, { empty: "No worker has registered yet." }),
      );
    };
    await draw();
    ctx.every(REFRESH_MS, draw);
  },
};

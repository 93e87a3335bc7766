// What the views compute: strict caps, worker states and lag, list queries, bulk filters, the
// config form's body.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  bulkFilter,
  configBody,
  describeFilter,
  fleetSummary,
  formatLabelWeights,
  laneOf,
  listQuery,
  parseLabelWeights,
  strictCap,
  workerRows,
  workerState,
} from "../../services/api/ui/model.js";

test("the strict cap follows the workers' rule on the reference's checked cases", () => {
  const cases = [
    [7, 0, 0], [7, 1, 1], [7, 24, 2], [7, 25, 2], [7, 26, 2], [7, 50, 4], [7, 99, 7],
    [7, 100, 7], [10, 20, 2], [10, 21, 3], [10, 25, 3], [4, 25, 1], [0, 50, 0], [5, -10, 0], [5, 150, 5],
  ];
  for (const [concurrency, pct, cap] of cases) assert.equal(strictCap(concurrency, pct), cap, `${concurrency} ${pct}`);
});

test("lanes by priority", () => {
  assert.equal(laneOf(0), "normal");
  assert.equal(laneOf(1), "strict");
  assert.equal(laneOf(2147483646), "strict");
  assert.equal(laneOf(2147483647), "control");
});

const worker = (over) => ({
  id: "w", hostname: "h", pid: 1, concurrency: 10, status: "online", alive: true,
  applied_config_version: 3, inflight: 4, strict_inflight: 1, last_heartbeat: "2026-12-01T10:00:00Z", ...over,
});

test("a worker is alive, draining or offline", () => {
  assert.equal(workerState(worker({})), "alive");
  assert.equal(workerState(worker({ alive: false, status: "draining" })), "draining");
  assert.equal(workerState(worker({ alive: false, status: "offline" })), "offline");
  // online with a stale heartbeat: the fleet no longer counts it
  assert.equal(workerState(worker({ alive: false, status: "online" })), "offline");
});

test("worker rows: load per lane, and only alive workers behind the latest version lag", () => {
  const rows = workerRows(
    [worker({ id: "a" }), worker({ id: "b", applied_config_version: 2 }), worker({ id: "c", alive: false, status: "offline", applied_config_version: 1 })],
    3,
  );
  assert.deepEqual(rows.map((r) => [r.id, r.state, r.lagging]), [["a", "alive", false], ["b", "alive", true], ["c", "offline", false]]);
  assert.deepEqual([rows[0].strictInflight, rows[0].normalInflight], [1, 3]);
  assert.equal(rows[0].host, "h (pid 1)");
  assert.equal(rows[0].tags, null);
  assert.deepEqual(workerRows([worker({ tags: ["gpu"], task_types: ["x"] })], 3)[0].tags, ["gpu"]);
});

test("the fleet summary adds up the alive workers' slots and strict caps", () => {
  const workers = [worker({ id: "a", concurrency: 7 }), worker({ id: "b", concurrency: 4, applied_config_version: 2 }), worker({ id: "c", alive: false })];
  const summary = fleetSummary(workers, { version: 3, payload: { maxStrictPercentage: 25 } });
  assert.deepEqual(summary, {
    alive: 2, slots: 11, inflight: 8, strictCap: 3, strictInflight: 2, maxStrictPercentage: 25, version: 3, lagging: ["b"],
  });
  assert.equal(fleetSummary([], null).maxStrictPercentage, 100);
});

test("the list query carries the filters, the cursor and the page size", () => {
  assert.equal(listQuery({ status: "failed", label: "a", cursor: "17", view: "x" }, 50).toString(), "status=failed&label=a&cursor=17&limit=50&bodies=false");
  assert.equal(listQuery({}).toString(), "limit=50&bodies=false");
});

test("a bulk filter narrows when it can, says all only when nothing else does", () => {
  assert.deepEqual(bulkFilter({ status: "failed" }, "failed"), { status: ["failed"], all: true });
  assert.deepEqual(bulkFilter({ status: "failed", type: "t", label: "a" }, "failed"), { status: ["failed"], type: "t", labels: ["a"] });
  assert.deepEqual(bulkFilter({}, "pending"), { status: ["pending"], all: true });
  assert.equal(bulkFilter({ status: "failed", worker: "w1" }, "failed"), null);
  assert.equal(bulkFilter({ status: "completed" }, "failed"), null);
});

test("a bulk filter reads as a question", () => {
  assert.equal(describeFilter({ status: ["failed"], all: true }), "every failed task");
  assert.equal(describeFilter({ status: ["failed"], type: "t", labels: ["a"] }), "every failed task of type t with the label a");
});

test("label weights are read from lines, with an error per bad line", () => {
  assert.deepEqual(parseLabelWeights("a = 5\n\n b:2 \nc 3"), { weights: { a: 5, b: 2, c: 3 }, errors: [] });
  const { weights, errors } = parseLabelWeights("a = 0\nb = x\nlonely\nd = 1.5\ne = 4");
  assert.deepEqual(weights, { e: 4 });
  assert.deepEqual(errors.map((e) => e.slice(0, 6)), ["line 1", "line 2", "line 3", "line 4"]);
  assert.equal(formatLabelWeights({ a: 5, b: 2 }), "a = 5\nb = 2");
  assert.deepEqual(parseLabelWeights(formatLabelWeights({ "x y": 7 })).weights, { "x y": 7 });
});

test("the config body carries only what changed since the form was drawn", () => {
  // The form sent all three fields: changing the strict share from a tab opened earlier undid
  // the label weights another operator had set since.
  const base = { maxStrictPercentage: 50, defaultWeight: 2, labelWeights: { a: 5 } };
  const form = { maxStrictPercentage: "80", defaultWeight: "2", labelWeights: "a = 5" };
  assert.deepEqual(configBody(form, base), { body: { maxStrictPercentage: 80 }, errors: [] });
  assert.deepEqual(configBody({ ...form, maxStrictPercentage: "50", labelWeights: "a = 5\nb = 1" }, base).body, {
    labelWeights: { a: 5, b: 1 },
  });
  assert.deepEqual(configBody({ ...form, maxStrictPercentage: "50", labelWeights: "" }, base).body, { labelWeights: {} });
  assert.deepEqual(configBody({ ...form, maxStrictPercentage: "50", defaultWeight: "3" }, base).body, { defaultWeight: 3 });
  const unchanged = configBody({ ...form, maxStrictPercentage: "50" }, base);
  assert.match(unchanged.errors[0], /Nothing changed/);
  // Without a base (no form state), every field, as before.
  assert.deepEqual(Object.keys(configBody(form).body).sort(), ["defaultWeight", "labelWeights", "maxStrictPercentage"]);
});

test("the config body: whole numbers in range, or a plain-language error", () => {
  assert.deepEqual(configBody({ maxStrictPercentage: "50", defaultWeight: "2", labelWeights: "a = 5" }), {
    body: { maxStrictPercentage: 50, defaultWeight: 2, labelWeights: { a: 5 } },
    errors: [],
  });
  const bad = configBody({ maxStrictPercentage: "101", defaultWeight: "0", labelWeights: "a = -1" });
  assert.equal(bad.errors.length, 3);
  assert.match(bad.errors[0], /Strict lane share/);
  assert.match(bad.errors[1], /Default group weight/);
  assert.match(bad.errors[2], /Label weights, line 1/);
  assert.match(configBody({ maxStrictPercentage: "", defaultWeight: "1", labelWeights: "" }).errors[0], /Strict lane share/);
  assert.equal(configBody({ maxStrictPercentage: "0", defaultWeight: "1", labelWeights: "", requestId: "r1" }).body.requestID, "r1");
});

// A config change's event stream, read in arbitrary chunks and folded into what the Config view
// draws.
import assert from "node:assert/strict";
import { test } from "node:test";

import { describeEvent, initialConvergence, isFinished, ndjsonReader, reduceConvergence } from "../../services/api/ui/convergence.js";

const EVENTS = [
  { event: "enqueued", task_id: 17, request_id: "r1", deduplicated: false },
  { event: "version", version: 4 },
  { event: "progress", version: 4, alive_workers: 3, applied_workers: 1, lagging: ["w2", "w3"] },
  { event: "progress", version: 4, alive_workers: 3, applied_workers: 3, lagging: [] },
  { event: "converged", version: 4, seconds: 0.82 },
];
const TEXT = EVENTS.map((e) => JSON.stringify(e) + "\n").join("");

test("NDJSON split anywhere, even inside a character, gives the same events", () => {
  const encoded = new TextEncoder().encode(TEXT);
  for (const size of [1, 2, 3, 7, 64, encoded.length]) {
    const reader = ndjsonReader();
    const decoder = new TextDecoder();
    const events = [];
    for (let i = 0; i < encoded.length; i += size) {
      events.push(...reader.push(decoder.decode(encoded.slice(i, i + size), { stream: true })));
    }
    events.push(...reader.end());
    assert.deepEqual(events, EVENTS, `chunks of ${size}`);
  }
});

test("a last line without a newline still counts; a broken line is skipped and counted", () => {
  const reader = ndjsonReader();
  assert.deepEqual(reader.push('{"event":"version","version":1}\nnot json\n{"event":"conv'), [{ event: "version", version: 1 }]);
  assert.deepEqual(reader.end(), []);
  assert.equal(reader.skipped, 2);
  const other = ndjsonReader();
  other.push('{"event":"version","version":2}');
  assert.deepEqual(other.end(), [{ event: "version", version: 2 }]);
});

test("the events fold into the change's state, one step each", () => {
  const state = EVENTS.reduce(reduceConvergence, initialConvergence("r1"));
  assert.equal(state.requestId, "r1");
  assert.equal(state.taskId, 17);
  assert.equal(state.version, 4);
  assert.equal(state.outcome, "converged");
  assert.deepEqual([state.aliveWorkers, state.appliedWorkers, state.lagging], [3, 3, []]);
  assert.ok(isFinished(state));
  assert.deepEqual(state.steps.map((s) => s.event), ["enqueued", "version", "progress", "progress", "converged"]);
  assert.equal(state.steps[2].text, "1 of 3 alive workers applied version 4; waiting for w2, w3");
});

test("the state is not changed in place", () => {
  const start = initialConvergence("r1");
  reduceConvergence(start, EVENTS[0]);
  assert.deepEqual(start, initialConvergence("r1"));
});

test("every outcome reads in plain words", () => {
  assert.equal(describeEvent({ event: "converged", version: 4, seconds: 0.82 }), "Converged: every alive worker runs version 4 (820 ms after it was written)");
  assert.equal(
    describeEvent({ event: "converged", version: 4, seconds: 0.82, excluded: [{ id: "m3", reason: "heartbeat expired" }] }),
    "Converged: every alive worker runs version 4 (820 ms after it was written); left out: m3 (heartbeat expired)",
  );
  assert.match(describeEvent({ event: "superseded", version: 4, superseded_by: 5 }), /^Superseded by version 5/);
  assert.match(describeEvent({ event: "timeout", version: 4, lagging: ["w2"] }), /still waiting for w2/);
  assert.equal(describeEvent({ event: "failed", error: "boom" }), "Failed: boom");
  assert.equal(describeEvent({ event: "progress", version: null, alive_workers: 0, applied_workers: 0, lagging: [] }), "No worker is alive to apply it");
  assert.match(describeEvent({ event: "enqueued", task_id: 3, deduplicated: true }), /^Attached/);
  for (const outcome of ["superseded", "timeout", "failed"]) {
    const state = reduceConvergence(initialConvergence(), { event: outcome, version: 1, superseded_by: 2, lagging: [], error: "x" });
    assert.equal(state.outcome, outcome);
    assert.ok(isFinished(state));
  }
  assert.ok(!isFinished(reduceConvergence(initialConvergence(), EVENTS[2])));
});

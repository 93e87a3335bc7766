// Numbers with units, in plain words.
import assert from "node:assert/strict";
import { test } from "node:test";

import { formatAgo, formatCount, formatDuration, formatJson, formatPercent, formatTime, plural } from "../../services/api/ui/format.js";

test("counts are grouped by thousands", () => {
  assert.equal(formatCount(0), "0");
  assert.equal(formatCount(1234567), "1,234,567");
  assert.equal(formatCount("12"), "12");
  assert.equal(formatCount(undefined), "0");
});

test("plural agrees with the number", () => {
  assert.equal(plural(0, "task"), "0 tasks");
  assert.equal(plural(1, "task"), "1 task");
  assert.equal(plural(2500, "task"), "2,500 tasks");
  assert.equal(plural(1, "alive worker"), "1 alive worker");
});

test("durations pick units a person reads at a glance", () => {
  const cases = [
    [0, "0 s"],
    [-3, "0 s"],
    [NaN, "0 s"],
    [0.25, "250 ms"],
    [0.0004, "0 ms"],
    [1.5, "1.5 s"],
    [4.04, "4 s"],
    [9.96, "10 s"],
    [45, "45 s"],
    [59.6, "1 min"],
    [60, "1 min"],
    [185, "3 min 5 s"],
    [3600, "1 h"],
    [3605, "1 h"],
    [7800, "2 h 10 min"],
    [86400 * 3 + 3600 * 4 + 59, "3 d 4 h"],
  ];
  for (const [seconds, text] of cases) assert.equal(formatDuration(seconds), text, String(seconds));
});

test("ago and in, from a given now", () => {
  const now = Date.parse("2026-12-01T10:00:00Z");
  assert.equal(formatAgo("2026-12-01T09:59:48Z", now), "12 s ago");
  assert.equal(formatAgo("2026-12-01T09:56:55Z", now), "3 min 5 s ago");
  assert.equal(formatAgo("2026-12-01T10:05:00Z", now), "in 5 min");
  assert.equal(formatAgo("2026-12-01T10:00:00.4Z", now), "just now");
  assert.equal(formatAgo(null, now), "never");
  assert.equal(formatAgo("not a time", now), "unknown");
});

test("times read the same everywhere: UTC, to the second", () => {
  assert.equal(formatTime("2026-12-01T10:20:30.123456+01:00"), "2026-12-01 09:20:30 UTC");
  assert.equal(formatTime(null), "—");
  assert.equal(formatTime("garbage"), "—");
});

test("percentages round, and nothing of nothing is 0 %", () => {
  assert.equal(formatPercent(1, 4), "25 %");
  assert.equal(formatPercent(2, 3), "67 %");
  assert.equal(formatPercent(0, 0), "0 %");
});

test("JSON is indented, and absence is a dash", () => {
  assert.equal(formatJson({ a: [1] }), '{\n  "a": [\n    1\n  ]\n}');
  assert.equal(formatJson(null), "—");
  assert.equal(formatJson(false), "false");
});

// The fragment holds the console's state: parse and build must round-trip, and the token must
// come out of what the address bar keeps.
import assert from "node:assert/strict";
import { test } from "node:test";

import { buildFragment, parseFragment, withoutToken } from "../../services/api/ui/fragment.js";

test("a link's token, view and filters are read", () => {
  assert.deepEqual(parseFragment("#token=s3cret&view=tasks&status=failed&label=a%20b"), {
    token: "s3cret",
    view: "tasks",
    params: { status: "failed", label: "a b" },
  });
});

test("no fragment means the overview, no token", () => {
  assert.deepEqual(parseFragment(""), { token: null, view: "overview", params: {} });
  assert.deepEqual(parseFragment("#"), { token: null, view: "overview", params: {} });
});

test("empty values are dropped when reading and when building", () => {
  assert.deepEqual(parseFragment("#view=tasks&type=&status=failed").params, { status: "failed" });
  assert.equal(buildFragment("tasks", { type: "", label: null, worker: undefined, status: "failed" }), "#view=tasks&status=failed");
});

test("params are written in name order, so equal states give equal links", () => {
  assert.equal(buildFragment("tasks", { status: "failed", label: "x" }), "#view=tasks&label=x&status=failed");
  assert.equal(buildFragment("tasks", { label: "x", status: "failed" }), "#view=tasks&label=x&status=failed");
});

test("build never writes a token, and special characters survive a round trip", () => {
  const hash = buildFragment("tasks", { token: "leak", type: "a&b=c #d", label: "é" });
  assert.ok(!hash.includes("leak"));
  const back = parseFragment(hash);
  assert.equal(back.view, "tasks");
  assert.deepEqual(back.params, { type: "a&b=c #d", label: "é" });
});

test("withoutToken keeps the view and the filters", () => {
  assert.equal(withoutToken("#token=s3cret&view=tasks&status=failed"), "#view=tasks&status=failed");
  assert.equal(withoutToken("#token=s3cret"), "#view=overview");
});

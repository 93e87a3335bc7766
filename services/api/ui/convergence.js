// A config change as it spreads: the NDJSON event stream of PUT /runtime-config (or of
// GET /runtime-config/requests/{id}?watch=true) read into one state the Config view draws.
// Pure functions (tests/js/convergence.test.js); docs/reference.md#config-events has the events.

import { formatDuration, plural } from "./format.js";

export const FINAL_EVENTS = ["converged", "superseded", "timeout", "failed"];

/** A reader of NDJSON text that arrives in arbitrary chunks: push(chunk) returns the events
 * completed by that chunk; end() returns the last one if the stream did not end with a newline.
 * A line that is not JSON is skipped (and counted in `skipped`). */
export function ndjsonReader() {
  let buffer = "";
  const reader = {
    skipped: 0,
    push(chunk) {
      buffer += chunk;
      const lines = buffer.split("\n");
      buffer = lines.pop();
      return lines.flatMap((line) => parse(line));
    },
    end() {
      const rest = buffer;
      buffer = "";
      return parse(rest);
    },
  };
  function parse(line) {
    if (!line.trim()) return [];
    try {
      return [JSON.parse(line)];
    } catch {
      reader.skipped += 1;
      return [];
    }
  }
  return reader;
}

/** The state before any event. */
export function initialConvergence(requestId = null) {
  return {
    requestId,
    taskId: null,
    version: null,
    aliveWorkers: null,
    appliedWorkers: null,
    lagging: [],
    outcome: null,
    steps: [],
  };
}

/** "; left out: m3 (heartbeat expired)" for the workers a change left out, else "". */
function leftOut(excluded) {
  if (!Array.isArray(excluded) || excluded.length === 0) return "";
  return `; left out: ${excluded.map((w) => `${w.id} (${w.reason})`).join(", ")}`;
}

/** One plain-language line per event. */
export function describeEvent(event) {
  switch (event.event) {
    case "enqueued":
      return event.deduplicated
        ? `Attached to the change already under way (update task ${event.task_id})`
        : `Enqueued as update task ${event.task_id}`;
    case "version":
      return `Version ${event.version} written`;
    case "progress": {
      const base = `${event.applied_workers} of ${plural(event.alive_workers, "alive worker")} applied`;
      const version = event.version === null ? "the change" : `version ${event.version}`;
      const waiting = event.lagging.length ? `; waiting for ${event.lagging.join(", ")}` : "";
      if (event.alive_workers === 0) return "No worker is alive to apply it";
      return `${base} ${version}${waiting}`;
    }
    case "converged":
      return `Converged: every alive worker runs version ${event.version} (${formatDuration(event.seconds)} after it was written)${leftOut(event.excluded)}`;
    case "superseded":
      return `Superseded by version ${event.superseded_by} before it converged; the fleet follows the newer one`;
    case "timeout":
      return `Stopped watching after the timeout; still waiting for ${event.lagging.join(", ") || "the update task"}${leftOut(event.excluded)} (the change goes on)`;
    case "failed":
      return `Failed: ${event.error}`;
    default:
      return `Unknown event ${event.event}`;
  }
}

/** The state after one more event. */
export function reduceConvergence(state, event) {
  const next = { ...state, steps: [...state.steps, { event: event.event, text: describeEvent(event) }] };
  switch (event.event) {
    case "enqueued":
      next.taskId = event.task_id;
      next.requestId = event.request_id ?? state.requestId;
      break;
    case "version":
      next.version = event.version;
      break;
    case "progress":
      next.version = event.version ?? state.version;
      next.aliveWorkers = event.alive_workers;
      next.appliedWorkers = event.applied_workers;
      next.lagging = event.lagging;
      break;
    case "converged":
      next.outcome = "converged";
      next.version = event.version ?? state.version;
      next.appliedWorkers = state.aliveWorkers;
      next.lagging = [];
      break;
    case "superseded":
      next.outcome = "superseded";
      break;
    case "timeout":
      next.outcome = "timeout";
      next.lagging = event.lagging ?? state.lagging;
      break;
    case "failed":
      next.outcome = "failed";
      break;
    default:
      break;
  }
  return next;
}

/** Whether the change is over (one final event seen). */
export function isFinished(state) {
  return FINAL_EVENTS.includes(state.outcome);
}

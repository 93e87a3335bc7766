// What the views compute from the API's answers. Pure functions (tests/js/model.test.js).

export const STATUSES = ["pending", "running", "completed", "failed", "cancelled"];
export const LANES = ["control", "strict", "normal"];
export const CONTROL_PRIORITY = 2147483647;

/** The lane of a task's priority (docs/reference.md#lanes). */
export function laneOf(priority) {
  if (priority >= CONTROL_PRIORITY) return "control";
  return priority > 0 ? "strict" : "normal";
}

/** A worker's strict cap: ceil(concurrency x percentage / 100), 0 at or below 0 %, all slots at
 * or above 100 %; integer arithmetic, the same rule as the workers' (docs/reference.md#strict-cap). */
export function strictCap(concurrency, percentage) {
  if (concurrency <= 0 || percentage <= 0) return 0;
  if (percentage >= 100) return concurrency;
  return Math.min(concurrency, Math.ceil((concurrency * percentage) / 100));
}

/** A worker's state in words: "alive", "draining" or "offline" (an online worker whose heartbeat
 * is stale is offline too: the fleet no longer counts it). */
export function workerState(worker) {
  if (worker.alive) return "alive";
  if (worker.status === "draining") return "draining";
  return "offline";
}

/** The worker rows of the Workers view, with their state, load per lane and whether they lag
 * behind the latest config version. */
export function workerRows(workers, latestVersion) {
  return workers.map((w) => {
    const state = workerState(w);
    return {
      id: w.id,
      state,
      concurrency: w.concurrency,
      strictInflight: w.strict_inflight,
      normalInflight: Math.max(0, w.inflight - w.strict_inflight),
      appliedVersion: w.applied_config_version,
      lagging: state === "alive" && w.applied_config_version < latestVersion,
      lastHeartbeat: w.last_heartbeat,
      host: `${w.hostname} (pid ${w.pid})`,
      tags: Array.isArray(w.tags) ? w.tags : null,
      taskTypes: Array.isArray(w.task_types) ? w.task_types : null,
    };
  });
}

/** The alive fleet at a glance: slots, strict cap in use, config lag. */
export function fleetSummary(workers, config) {
  const alive = workers.filter((w) => w.alive);
  const percentage = config?.payload?.maxStrictPercentage ?? 100;
  const version = config?.version ?? 0;
  let slots = 0;
  let cap = 0;
  let strict = 0;
  let inflight = 0;
  for (const w of alive) {
    slots += w.concurrency;
    cap += strictCap(w.concurrency, percentage);
    strict += w.strict_inflight;
    inflight += w.inflight;
  }
  return {
    alive: alive.length,
    slots,
    inflight,
    strictCap: cap,
    strictInflight: strict,
    maxStrictPercentage: percentage,
    version,
    lagging: alive.filter((w) => w.applied_config_version < version).map((w) => w.id),
  };
}

const LIST_FILTERS = ["status", "type", "label", "worker"];

/** The query of GET /tasks for the Tasks view's params (filters, page size, keyset cursor). */
export function listQuery(params, limit = 50) {
  const query = new URLSearchParams();
  for (const key of LIST_FILTERS) if (params[key]) query.set(key, params[key]);
  if (params.cursor) query.set("cursor", params.cursor);
  query.set("limit", String(limit));
  // The list shows neither payloads nor results: a page of large ones weighed megabytes.
  query.set("bodies", "false");
  return query;
}

/** The body of POST /tasks/retry (or /tasks/cancel) for the Tasks view's filters, acting on
 * `status`. null when the filters cannot be expressed as a bulk filter (a worker filter; or a
 * list filtered on another status). "all": true only when nothing else narrows it: the API
 * refuses an empty filter so that a forgotten field never acts on the whole queue. */
export function bulkFilter(params, status) {
  if (params.worker) return null;
  if (params.status && params.status !== status) return null;
  const body = { status: [status] };
  if (params.type) body.type = params.type;
  if (params.label) body.labels = [params.label];
  if (!body.type && !body.labels) body.all = true;
  return body;
}

/** Describe a filter for a confirmation question: "every failed task of type demo.fail with the
 * label a". */
export function describeFilter(body) {
  const parts = [`every ${body.status.join(" or ")} task`];
  if (body.type) parts.push(`of type ${body.type}`);
  if (body.labels) parts.push(`with the label ${body.labels.join(" and ")}`);
  return parts.join(" ");
}

/** Read the label weights typed as "label = weight" lines (or "label: weight", or
 * "label weight"); blank lines are skipped. Returns { weights, errors } with one plain-language
 * error per bad line. */
export function parseLabelWeights(text) {
  const weights = {};
  const errors = [];
  const lines = String(text || "").split(/\r?\n/);
  lines.forEach((raw, index) => {
    const line = raw.trim();
    if (!line) return;
    const match = line.match(/^(.+?)\s*(?:=|:|\s)\s*(\S+)$/);
    const weight = match ? Number(match[2]) : NaN;
    if (!match || !Number.isInteger(weight) || weight < 1) {
      errors.push(`line ${index + 1}: write "label = weight" with a whole number of at least 1`);
      return;
    }
    weights[match[1].trim()] = weight;
  });
  return { weights, errors };
}

/** The label weights as the lines parseLabelWeights reads. */
export function formatLabelWeights(weights) {
  return Object.entries(weights || {})
    .map(([label, weight]) => `${label} = ${weight}`)
    .join("\n");
}

/** The PATCH /runtime-config body from the edit form's values; { body, errors }. */
export function configBody({ maxStrictPercentage, defaultWeight, labelWeights, requestId }, base = null) {
  const errors = [];
  const body = {};
  const pct = Number(maxStrictPercentage);
  if (String(maxStrictPercentage).trim() === "" || !Number.isInteger(pct) || pct < 0 || pct > 100) {
    errors.push("Strict lane share: a whole number from 0 to 100");
  } else {
    body.maxStrictPercentage = pct;
  }
  const weight = Number(defaultWeight);
  if (String(defaultWeight).trim() === "" || !Number.isInteger(weight) || weight < 1) {
    errors.push("Default group weight: a whole number of at least 1");
  } else {
    body.defaultWeight = weight;
  }
  const parsed = parseLabelWeights(labelWeights);
  errors.push(...parsed.errors.map((e) => `Label weights, ${e}`));
  body.labelWeights = parsed.weights;
  if (base && !errors.length) {
    // Only what the operator changed since the form was drawn from ``base`` (the payload then):
    // a field left alone must not undo what someone else set meanwhile (the body is a PATCH).
    if (body.maxStrictPercentage === base.maxStrictPercentage) delete body.maxStrictPercentage;
    if (body.defaultWeight === base.defaultWeight) delete body.defaultWeight;
    if (sameWeights(body.labelWeights, base.labelWeights || {})) delete body.labelWeights;
    if (!Object.keys(body).length) errors.push("Nothing changed: edit a field before applying");
  }
  if (requestId) body.requestID = requestId;
  return { body, errors };
}

function sameWeights(a, b) {
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length && keys.every((k) => Object.hasOwn(b, k) && a[k] === b[k]);
}

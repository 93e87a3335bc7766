// Runtime config: the current version and payload, each alive worker's applied version, an edit
// form, and a change's convergence drawn live from its event stream (enqueued -> version ->
// progress per worker -> outcome). The request id goes into the fragment before the change is
// sent, so a reload (or a shared link) re-attaches to the same change.

import { badge, figure, h, notice, replace, table } from "../dom.js";
import { buildFragment } from "../fragment.js";
import { formatJson, formatTime, plural } from "../format.js";
import { initialConvergence, isFinished, ndjsonReader, reduceConvergence } from "../convergence.js";
import { configBody, formatLabelWeights } from "../model.js";

const WATCH_TIMEOUT_SECONDS = 120;

/** A request id without crypto.randomUUID, which plain-http pages on another host lack. */
function newRequestId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function current(config) {
  const p = config.payload;
  const weights = Object.entries(p.labelWeights || {});
  return [
    h(
      "div",
      { class: "figures" },
      figure("Version", String(config.version), config.created_at ? `written ${formatTime(config.created_at)}` : "the defaults: never changed"),
      figure("Strict lane share", `${p.maxStrictPercentage} %`, "of each worker's slots"),
      figure("Default group weight", String(p.defaultWeight), "tasks with no weighted label"),
      figure("Applied", `${config.applied_workers} of ${plural(config.alive_workers, "alive worker")}`, config.lagging.length ? `behind: ${config.lagging.join(", ")}` : "none behind"),
    ),
    h("h3", {}, "Label weights"),
    table(
      [
        { title: "Label", cell: ([label]) => label },
        { title: "Weight", class: "num", cell: ([, weight]) => String(weight) },
      ],
      weights,
      { empty: "No weighted labels: every normal-lane task is in the default group." },
    ),
    h("details", {}, h("summary", {}, "Stored payload"), h("pre", { class: "json" }, formatJson(p))),
  ];
}

function form(config, onSubmit) {
  const p = config.payload;
  const errors = h("div", { class: "messages" });
  const field = (id, label, input, hint) => h("div", { class: "field" }, h("label", { for: id }, label), input, hint ? h("p", { class: "hint" }, hint) : null);
  const pct = h("input", { id: "max-strict", name: "maxStrictPercentage", type: "number", min: 0, max: 100, step: 1, value: String(p.maxStrictPercentage), required: true });
  const dw = h("input", { id: "default-weight", name: "defaultWeight", type: "number", min: 1, step: 1, value: String(p.defaultWeight), required: true });
  const lw = h("textarea", { id: "label-weights", name: "labelWeights", rows: 4, placeholder: "tenant-a = 5\ntenant-b = 1" });
  lw.value = formatLabelWeights(p.labelWeights);
  return h(
    "form",
    {
      class: "config-form",
      on: {
        submit: (event) => {
          event.preventDefault();
          const { body, errors: problems } = configBody({ maxStrictPercentage: pct.value, defaultWeight: dw.value, labelWeights: lw.value }, p);
          if (problems.length) {
            replace(errors, problems.map((problem) => notice(problem, "error")));
            return;
          }
          replace(errors);
          onSubmit(body);
        },
      },
    },
    field("max-strict", "Strict lane share (%)", pct, "Each worker runs at most this share of its slots from the strict lane (rounded up)."),
    field("default-weight", "Default group weight", dw, "The weight of normal-lane tasks that carry no weighted label."),
    field("label-weights", "Label weights", lw, 'One "label = weight" per line; a task belongs to its smallest weighted label.'),
    errors,
    h("div", { class: "field actions" }, h("button", { type: "submit", id: "apply-config" }, "Apply to the fleet")),
  );
}

function progressPanel(state) {
  const alive = state.aliveWorkers ?? 0;
  const applied = state.appliedWorkers ?? 0;
  const outcome = state.outcome
    ? badge(state.outcome, state.outcome === "converged" || state.outcome === "superseded" ? "completed" : "failed")
    : badge("in progress", "running");
  return h(
    "section",
    { class: "convergence", id: "convergence", dataset: { outcome: state.outcome || "" } },
    h("h2", {}, "Change ", outcome),
    h("p", { class: "muted" }, `Request ${state.requestId}`, state.version ? `, version ${state.version}` : ""),
    state.aliveWorkers === null
      ? null
      : h("div", { class: "meter-row" }, h("meter", { min: 0, max: Math.max(alive, 1), value: applied }), h("span", {}, `${applied} of ${plural(alive, "alive worker")} applied`)),
    h("ol", { class: "steps" }, state.steps.map((step) => h("li", { class: `step step-${step.event}` }, step.text))),
  );
}

export default {
  id: "config",
  title: "Runtime config",
  admin: true,
  async render(ctx) {
    const currentBox = h("div", { class: "current" });
    const changeBox = h("div", { class: "change" });
    const formBox = h("div", { class: "edit" });
    replace(
      ctx.root,
      h("h1", {}, "Runtime config"),
      changeBox,
      h("section", {}, h("h2", {}, "Current"), currentBox),
      h("section", {}, h("h2", {}, "Change it"), formBox),
    );

    const drawCurrent = async () => {
      const config = await ctx.api.get("/runtime-config");
      if (!ctx.live) return config;
      replace(currentBox, current(config));
      return config;
    };

    const follow = async (requestId, send) => {
      let state = initialConvergence(requestId);
      const reader = ndjsonReader();
      const apply = (events) => {
        for (const event of events) state = reduceConvergence(state, event);
        if (ctx.live) replace(changeBox, progressPanel(state));
      };
      replace(changeBox, progressPanel(state));
      try {
        await send((chunk) => apply(reader.push(chunk)));
        apply(reader.end());
      } catch (error) {
        if (!ctx.live) return;
        replace(changeBox, notice(error.message, "error"));
        return;
      }
      if (!isFinished(state) && ctx.live) {
        changeBox.append(notice("The stream ended before an outcome; reload the page to re-attach.", "error"));
      }
      if (ctx.live) drawForm(await drawCurrent());
    };

    // The form compares what is submitted with the version it was drawn from, so it is drawn
    // again from the new version once a change of this page's has finished.
    const drawForm = (config) => replace(
      formBox,
      form(config, (body) => {
        const requestId = newRequestId();
        // In the link first: a reload from here re-attaches to this very change.
        history.replaceState(null, "", location.pathname + buildFragment("config", { request: requestId }));
        follow(requestId, (onChunk) =>
          // PATCH, not PUT: the form edits the strict share and the weights; what it does not
          // show (pauses, label limits, timers) stays as it is.
          ctx.api.stream("PATCH", "/runtime-config", {
            query: `timeout=${WATCH_TIMEOUT_SECONDS}`,
            body: { ...body, requestID: requestId },
            onChunk,
            signal: ctx.signal,
          }),
        );
      }),
    );
    drawForm(await drawCurrent());
    if (ctx.params.request) {
      const id = ctx.params.request;
      follow(id, (onChunk) =>
        ctx.api.stream("GET", `/runtime-config/requests/${encodeURIComponent(id)}`, {
          query: `watch=true&timeout=${WATCH_TIMEOUT_SECONDS}`,
          onChunk,
          signal: ctx.signal,
        }),
      );
    }
    ctx.every(5000, async () => {
      // The current version moves when anyone changes the config; keep it fresh.
      await drawCurrent();
    });
  },
};

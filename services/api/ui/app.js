// The console's entry point: sign-in, the navigation, and which view the fragment asks for.
//
// Auth: the token comes from the sign-in form or from the fragment (#token=...), is kept in this
// tab's sessionStorage (gone when the tab closes), is sent only as "Authorization: Bearer", and
// is taken out of the address bar at once. The role decides what is shown: the submit role sees,
// the admin role also acts (retry, cancel, config changes) and sees the fleet.

import { ApiError, createApi } from "./api.js";
import { badge, h, notice, replace } from "./dom.js";
import { buildFragment, parseFragment, withoutToken } from "./fragment.js";
import config from "./views/config.js";
import overview from "./views/overview.js";
import task from "./views/task.js";
import tasks from "./views/tasks.js";
import workers from "./views/workers.js";

// The views, in navigation order. A view is a module under views/ exporting
// { id, title, admin, render(ctx) }. Schedules and limits get theirs here when the API has them
// (GET /schedules; the labelLimits and paused* fields of the runtime config): one import and
// one entry below, and docs/console.md gets its screenshot.
const NAVIGATION = [overview, tasks, workers, config];
// Views reached by a link rather than from the navigation.
const LINKED = [task];

const TOKEN_KEY = "taskfleet.token";
const main = document.getElementById("main");
const nav = document.getElementById("nav");
const session = document.getElementById("session");

const state = { role: null, authOff: false, leave: null };
const api = createApi(() => sessionStorage.getItem(TOKEN_KEY));

function navigate(view, params = {}) {
  location.hash = buildFragment(view, params);
}

/** Who we are: "admin", "submit", or null for a token the API does not take. */
async function probeRole() {
  try {
    await api.get("/tasks", "limit=1");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return null;
    throw error;
  }
  try {
    await api.get("/workers", "limit=1");
    return "admin";
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) return "submit";
    throw error;
  }
}

function drawSession() {
  if (state.authOff) {
    replace(session, badge("authentication is off", "warning"));
    return;
  }
  replace(
    session,
    h("span", { class: "role", title: "The role of the token this tab signed in with" }, `${state.role} role`),
    h("button", { type: "button", class: "link", on: { click: signOut } }, "Sign out"),
  );
}

function drawNavigation(current) {
  replace(
    nav,
    NAVIGATION.map((view) =>
      h(
        "a",
        {
          href: buildFragment(view.id),
          class: view.id === current ? "current" : null,
          "aria-current": view.id === current ? "page" : null,
        },
        view.title,
      ),
    ),
  );
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.role = null;
  leaveView();
  drawSignIn();
}

function drawSignIn(message) {
  replace(nav);
  replace(session);
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "current-password",
    required: true,
    placeholder: "admin or submit token",
  });
  const form = h(
    "form",
    {
      class: "sign-in",
      on: {
        submit: (event) => {
          event.preventDefault();
          sessionStorage.setItem(TOKEN_KEY, input.value.trim());
          start();
        },
      },
    },
    h("h1", {}, "Sign in"),
    message ? notice(message, "error") : null,
    h("label", { for: "token" }, "API token"),
    input,
    h("p", { class: "muted" }, "A token with the submit role can look; the admin role can also retry, cancel and change the config. The token stays in this browser tab only."),
    h("button", { type: "submit", id: "sign-in" }, "Sign in"),
  );
  replace(main, form);
  input.focus();
}

function leaveView() {
  if (state.leave) state.leave();
  state.leave = null;
}

async function showView() {
  leaveView();
  const { view: id, params } = parseFragment(location.hash);
  const view = [...NAVIGATION, ...LINKED].find((v) => v.id === id) || overview;
  drawNavigation(view.id === "task" ? "tasks" : view.id);
  document.title = `${view.title} · taskfleet console`;
  const controller = new AbortController();
  const timers = new Set();
  state.leave = () => {
    controller.abort();
    for (const timer of timers) clearTimeout(timer);
  };
  if (view.admin && state.role !== "admin") {
    replace(main, h("h1", {}, view.title), notice(`This view needs a token with the admin role; this tab signed in with the ${state.role} role.`, "error"));
    return;
  }
  const status = h("div", { class: "refresh-status", "aria-live": "polite" });
  const root = h("div", { class: `view view-${view.id}` });
  replace(main, status, root);
  const ctx = {
    api,
    params,
    role: state.role,
    root,
    navigate,
    signal: controller.signal,
    get live() {
      return !controller.signal.aborted;
    },
    /** Call fn every `ms` while this view is shown and the tab is visible. */
    every(ms, fn) {
      // Each timer's id leaves the set when it fires: a page left open for days kept them all.
      const later = () => {
        const timer = setTimeout(() => {
          timers.delete(timer);
          tick();
        }, ms);
        timers.add(timer);
      };
      const tick = async () => {
        if (controller.signal.aborted) return;
        if (!document.hidden) {
          try {
            await fn();
            replace(status);
          } catch (error) {
            if (!reportAuthFailure(error)) replace(status, notice(`Could not refresh: ${error.message}`, "error"));
          }
        }
        if (!controller.signal.aborted) later();
      };
      later();
    },
  };
  try {
    await view.render(ctx);
  } catch (error) {
    if (controller.signal.aborted || reportAuthFailure(error)) return;
    replace(root, h("h1", {}, view.title), notice(error.message, "error"));
  }
}

/** A 401 mid-session (the token was rotated away): back to the sign-in form. */
function reportAuthFailure(error) {
  if (error instanceof ApiError && error.status === 401 && !state.authOff) {
    sessionStorage.removeItem(TOKEN_KEY);
    leaveView();
    drawSignIn("The API no longer accepts this token. Sign in again.");
    return true;
  }
  return false;
}

async function start() {
  const { token } = parseFragment(location.hash);
  if (token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname + location.search + withoutToken(location.hash));
  }
  const hadToken = Boolean(sessionStorage.getItem(TOKEN_KEY));
  let role;
  try {
    role = await probeRole();
  } catch (error) {
    replace(main, notice(`The API did not answer: ${error.message}`, "error"));
    return;
  }
  if (role === null) {
    sessionStorage.removeItem(TOKEN_KEY);
    drawSignIn(hadToken ? "The API does not accept that token." : undefined);
    return;
  }
  state.role = role;
  state.authOff = !hadToken; // the API answered without a token: authentication is off
  drawSession();
  await showView();
}

window.addEventListener("hashchange", () => {
  // A link with a token in it (pasted into this tab) signs in again with that token.
  if (state.role && !parseFragment(location.hash).token) showView();
  else start();
});
start();

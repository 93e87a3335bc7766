// The console's state lives in the URL fragment, so a link reproduces what it shows:
//   /ui/#token=...&view=tasks&status=failed
// The fragment never reaches the server (browsers do not send it), which is why the token may
// travel in it; the console moves it into sessionStorage and takes it out of the address bar.

export const DEFAULT_VIEW = "overview";

/** Parse "#a=1&b=2" into { token, view, params } (params excludes token and view). */
export function parseFragment(hash) {
  const search = new URLSearchParams(String(hash || "").replace(/^#/, ""));
  const params = {};
  for (const [key, value] of search) {
    if (key !== "token" && key !== "view" && value !== "") params[key] = value;
  }
  return {
    token: search.get("token") || null,
    view: search.get("view") || DEFAULT_VIEW,
    params,
  };
}

/** The fragment for a view and its params: view first, then the params by name; empty values
 * (undefined, null, "") are left out, so equal states give equal links. */
export function buildFragment(view, params = {}) {
  const search = new URLSearchParams();
  search.set("view", view || DEFAULT_VIEW);
  for (const key of Object.keys(params).sort()) {
    const value = params[key];
    if (key === "token" || key === "view") continue;
    if (value === undefined || value === null || value === "") continue;
    search.set(key, String(value));
  }
  return "#" + search.toString();
}

/** The same fragment without its token (what the address bar keeps after sign-in). */
export function withoutToken(hash) {
  const { view, params } = parseFragment(hash);
  return buildFragment(view, params);
}

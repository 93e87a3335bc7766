// Calls to the taskfleet API of the page's own origin, with the token of this browser tab
// (sessionStorage) as a bearer token. Nothing here knows about views.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** The API's refusal in one line: "HTTP 422: body.status.0: must be one of ...". */
export function errorMessage(status, body) {
  const detail = body && body.detail;
  if (typeof detail === "string") return `HTTP ${status}: ${detail}`;
  if (Array.isArray(detail) && detail.length) {
    const first = detail[0];
    const where = Array.isArray(first.loc) ? first.loc.join(".") : "";
    return `HTTP ${status}: ${where ? where + ": " : ""}${first.msg}`;
  }
  return `HTTP ${status}`;
}

export function createApi(getToken) {
  function headers(extra = {}) {
    const token = getToken();
    return token ? { Authorization: `Bearer ${token}`, ...extra } : { ...extra };
  }

  async function send(method, path, { query, body, accept = "application/json" } = {}) {
    const url = query ? `${path}?${query}` : path;
    const init = { method, headers: headers({ Accept: accept }), credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    const response = await fetch(url, init);
    if (!response.ok) {
      let parsed = null;
      try {
        parsed = await response.json();
      } catch {
        parsed = null;
      }
      throw new ApiError(response.status, errorMessage(response.status, parsed));
    }
    return response;
  }

  return {
    async get(path, query) {
      return (await send("GET", path, { query })).json();
    },
    async post(path, body) {
      return (await send("POST", path, { body })).json();
    },
    /** A streamed NDJSON answer: calls onChunk(text) for each piece as it arrives. */
    async stream(method, path, { query, body, onChunk, signal }) {
      const url = query ? `${path}?${query}` : path;
      const init = {
        method,
        headers: headers({ Accept: "application/x-ndjson" }),
        credentials: "omit",
        cache: "no-store",
        signal,
      };
      if (body !== undefined) {
        init.body = JSON.stringify(body);
        init.headers["Content-Type"] = "application/json";
      }
      const response = await fetch(url, init);
      if (!response.ok) {
        let parsed = null;
        try {
          parsed = await response.json();
        } catch {
          parsed = null;
        }
        throw new ApiError(response.status, errorMessage(response.status, parsed));
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        onChunk(value);
      }
    },
  };
}

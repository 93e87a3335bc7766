// Numbers with their units, in plain words. Pure functions (tests/js/format.test.js).

const grouped = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

/** 1234567 -> "1,234,567". */
export function formatCount(n) {
  return grouped.format(Number(n) || 0);
}

/** (1, "task") -> "1 task"; (3, "task") -> "3 tasks"; (2, "worker", "workers"). */
export function plural(n, one, many = one + "s") {
  return `${formatCount(n)} ${Number(n) === 1 ? one : many}`;
}

function trimmed(value) {
  // 1.50 -> "1.5", 2.00 -> "2"
  return String(Number(value.toFixed(1)));
}

/** Seconds as a short duration: "0 s", "250 ms", "4.2 s", "45 s", "3 min 5 s", "2 h 10 min",
 * "3 d 4 h". Negative or missing values count as 0. */
export function formatDuration(seconds) {
  let s = Number(seconds);
  if (!Number.isFinite(s) || s <= 0) return "0 s";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 10) return `${trimmed(s)} s`;
  s = Math.round(s);
  if (s < 60) return `${s} s`;
  const units = [
    ["d", 86400],
    ["h", 3600],
    ["min", 60],
    ["s", 1],
  ];
  // The largest unit, and the next one down when it is not zero: "2 h 10 min", "2 h".
  const i = units.findIndex(([, size]) => s >= size);
  const [name, size] = units[i];
  const parts = [`${Math.floor(s / size)} ${name}`];
  const next = units[i + 1];
  if (next && Math.floor((s % size) / next[1]) > 0) {
    parts.push(`${Math.floor((s % size) / next[1])} ${next[0]}`);
  }
  return parts.join(" ");
}

/** How long ago an ISO time was, from `nowMs`: "12 s ago", "3 min 5 s ago"; a future time
 * gives "in 5 min". */
export function formatAgo(iso, nowMs = Date.now()) {
  if (!iso) return "never";
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return "unknown";
  const seconds = (nowMs - then) / 1000;
  if (Math.abs(seconds) < 1) return "just now";
  return seconds >= 0 ? `${formatDuration(seconds)} ago` : `in ${formatDuration(-seconds)}`;
}

/** An ISO time as "2026-12-01 10:20:30 UTC" (one format for every reader, whatever the locale). */
export function formatTime(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "—";
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** A share as a percentage: (1, 4) -> "25 %"; nothing of nothing -> "0 %". */
export function formatPercent(part, whole) {
  if (!whole) return "0 %";
  return `${Math.round((100 * part) / whole)} %`;
}

/** JSON for display, indented; undefined and null show as "—". */
export function formatJson(value) {
  if (value === undefined || value === null) return "—";
  return JSON.stringify(value, null, 2);
}

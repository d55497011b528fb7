/** A sparkline as an SVG path: pure, so the sidebar only sets its `d`. */

/**
 * The `d` of a polyline through `values` (oldest first) in a `width` x `height` box, scaled between
 * their min and max (a flat line mid-height when they are all equal); '' for no values.
 */
export function sparklinePath(values: readonly number[], width: number, height: number): string {
  if (values.length === 0) {
    return '';
  }
  const lo = Math.min(...values);
  const hi = Math.max(...values);
  const pad = 2; // keep the stroke inside the box
  const y = (v: number) =>
    hi === lo ? height / 2 : pad + (height - 2 * pad) * (1 - (v - lo) / (hi - lo));
  if (values.length === 1) {
    return `M0,${y(values[0]).toFixed(1)}H${width}`;
  }
  const dx = width / (values.length - 1);
  return values
    .map((v, i) => `${i === 0 ? 'M' : 'L'}${(i * dx).toFixed(1)},${y(v).toFixed(1)}`)
    .join('');
}

/** Tokens per second, short: 950, 12.3k. */
export function formatRate(tokensPerSecond: number | null): string {
  if (tokensPerSecond === null) {
    return '–';
  }
  return tokensPerSecond >= 10000
    ? `${(tokensPerSecond / 1000).toFixed(1)}k`
    : `${Math.round(tokensPerSecond)}`;
}

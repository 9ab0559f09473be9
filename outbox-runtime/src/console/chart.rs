//! Charts drawn on the server as inline SVG: no script, nothing for the policy to allow.

use chrono::{DateTime, Duration, DurationRound, Utc};
use maud::{html, Markup};

/// Counts per minute over the `minutes` before `now`, one bar each, zero where `counts` has
/// none.
pub(super) fn per_minute(
    counts: &[(DateTime<Utc>, i64)],
    now: DateTime<Utc>,
    minutes: i64,
    label: &str,
) -> Markup {
    const WIDTH: i64 = 600;
    const HEIGHT: i64 = 120;
    let this_minute = now.duration_trunc(Duration::minutes(1)).unwrap_or(now);
    let first = this_minute - Duration::minutes(minutes - 1);
    let mut bars = vec![0_i64; usize::try_from(minutes).unwrap_or(0)];
    for (minute, count) in counts {
        let index = (*minute - first).num_minutes();
        if let Some(bar) = usize::try_from(index).ok().and_then(|index| bars.get_mut(index)) {
            *bar += count;
        }
    }
    let highest = bars.iter().copied().max().unwrap_or(0).max(1);
    let bar_width = WIDTH / minutes.max(1);
    html! {
        figure.chart {
            svg viewBox={"0 0 " (WIDTH) " " (HEIGHT + 16)} role="img" aria-label=(label) {
                @for (i, count) in (0..).zip(&bars) {
                    @let height = count * HEIGHT / highest;
                    @let minute = (first + Duration::minutes(i)).format("%H:%M UTC");
                    rect x=(i * bar_width) y=(HEIGHT - height) width=(bar_width - 1) height=(height) {
                        title { (minute) ": " (count) }
                    }
                }
                text x="0" y=(HEIGHT + 14) { (first.format("%H:%M")) }
                text x=(WIDTH) y=(HEIGHT + 14) text-anchor="end" { (this_minute.format("%H:%M")) }
            }
            figcaption { (label) ", highest " (highest) " a minute" }
        }
    }
}

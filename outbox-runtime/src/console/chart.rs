//! Charts drawn on the server as inline SVG bars: no script, nothing for the policy to allow.

use chrono::{DateTime, Duration, DurationRound, Utc};
use maud::{html, Markup};

/// A window of time cut into equal buckets, the last one holding `now`.
pub(super) struct Window {
    first: DateTime<Utc>,
    step: Duration,
    buckets: usize,
}

impl Window {
    /// `buckets` buckets of `step`, ending with the one that holds `now`.
    pub(super) fn ending(now: DateTime<Utc>, step: Duration, buckets: usize) -> Self {
        let last = now.duration_trunc(step).unwrap_or(now);
        let span = step * i32::try_from(buckets.saturating_sub(1)).unwrap_or(0);
        Window { first: last - span, step, buckets }
    }

    /// The values falling in each bucket, combined (`f64::max`, or a sum with `|a, b| a + b`);
    /// `None` where none falls.
    pub(super) fn collect(
        &self,
        values: impl IntoIterator<Item = (DateTime<Utc>, f64)>,
        combine: impl Fn(f64, f64) -> f64,
    ) -> Vec<Option<f64>> {
        let mut buckets = vec![None; self.buckets];
        let step = self.step.num_seconds().max(1);
        for (at, value) in values {
            let index = (at - self.first).num_seconds().div_euclid(step);
            if let Some(bucket) = usize::try_from(index).ok().and_then(|i| buckets.get_mut(i)) {
                *bucket = Some(bucket.map_or(value, |sum| combine(sum, value)));
            }
        }
        buckets
    }

    /// The bars of `buckets`, with `show` writing a value in the tooltips and the caption.
    pub(super) fn bars(
        &self,
        buckets: &[Option<f64>],
        label: &str,
        show: fn(f64) -> String,
    ) -> Markup {
        const WIDTH: f64 = 600.0;
        const HEIGHT: f64 = 120.0;
        let highest = buckets.iter().flatten().copied().fold(0.0, f64::max);
        let scale = if highest > 0.0 { HEIGHT / highest } else { 0.0 };
        let width = WIDTH / self.buckets.max(1) as f64;
        let last =
            self.first + self.step * i32::try_from(self.buckets.saturating_sub(1)).unwrap_or(0);
        html! {
            figure.chart {
                svg viewBox={"0 0 " (WIDTH) " " (HEIGHT + 16.0)} role="img" aria-label=(label) {
                    @for (i, value) in (0..).zip(buckets) {
                        @let at = (self.first + self.step * i).format("%H:%M UTC");
                        @let height = value.unwrap_or(0.0) * scale;
                        rect x=(f64::from(i) * width) y=(HEIGHT - height) width=(width * 0.85) height=(height) {
                            title { (at) ": " (value.map_or("no relay ran".to_owned(), show)) }
                        }
                    }
                    text x="0" y=(HEIGHT + 14.0) { (self.first.format("%H:%M")) }
                    text x=(WIDTH) y=(HEIGHT + 14.0) text-anchor="end" { (last.format("%H:%M")) }
                }
                figcaption { (label) "; highest " (show(highest)) }
            }
        }
    }
}

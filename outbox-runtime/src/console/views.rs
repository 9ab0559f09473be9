//! The pages' frame and the pieces several pages show.

use std::time::Duration;

use chrono::{DateTime, Utc};
use maud::{html, Markup, DOCTYPE};

use super::extract::Page;

/// The sections in the navigation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
    Overview,
    Relays,
    Events,
    Dead,
    Control,
}

const SECTIONS: [(Section, &str, &str); 5] = [
    (Section::Overview, "", "Overview"),
    (Section::Relays, "/relays", "Relays"),
    (Section::Events, "/events", "Events"),
    (Section::Dead, "/dead", "Dead letters"),
    (Section::Control, "/control", "Control"),
];

/// A whole page: navigation, title, body.
pub(super) fn layout(page: &Page, section: Section, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · outbox console" }
                link rel="stylesheet" href=(page.link("/assets/console.css"));
            }
            body {
                header {
                    span.brand { "outbox" }
                    nav {
                        @for (each, path, name) in SECTIONS {
                            a href=(page.link(path)) aria-current=[(each == section).then_some("page")] { (name) }
                        }
                    }
                    @if page.read_only { span.badge { "read-only" } }
                    @if page.logged_in {
                        form.logout method="post" action=(page.link("/logout")) {
                            (csrf(page))
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The hidden CSRF field every form carries.
pub(super) fn csrf(page: &Page) -> Markup {
    html! { input type="hidden" name="csrf" value=(page.csrf); }
}

/// An age as people read it: `850ms`, `42s`, `5m 12s`.
pub(super) fn age(duration: Duration) -> String {
    let rounded = if duration < Duration::from_secs(1) {
        Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    } else {
        Duration::from_secs(duration.as_secs())
    };
    humantime::format_duration(rounded).to_string()
}

/// An instant, to the second.
pub(super) fn instant(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// `aggregate_type / event_type`.
pub(super) fn event_type(aggregate_type: &str, event_type: &str) -> Markup {
    html! { code { (aggregate_type) } " / " code { (event_type) } }
}

/// A link to the event's page.
pub(super) fn event_link(page: &Page, event_id: &uuid::Uuid) -> Markup {
    html! { a.id href=(page.link(&format!("/events/{event_id}"))) { code { (event_id) } } }
}

/// A number with thousands separated: `12,345`.
pub(super) fn count(value: impl Into<i128>) -> String {
    let digits = value.into().to_string();
    let (sign, digits) = digits.split_at(usize::from(digits.starts_with('-')));
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{sign}{grouped}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ages_read_as_people_write_them() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(-1_234_567), "-1,234,567");
        assert_eq!(age(Duration::from_millis(850)), "850ms");
        assert_eq!(age(Duration::from_millis(312_400)), "5m 12s");
    }
}

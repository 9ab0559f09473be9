//! The selections the console's forms and API name: which dead letters, which published events
//! to replay. Times come as ages (`newer_than=2h`, as the CLI takes them) or, from a
//! confirmation page, as the instants it counted with (`since`, `until`), so the action touches
//! exactly the rows the confirmation counted, not those that died after it was shown.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::problem::Problem;
use crate::dead_letters::DeadFilter;

/// A dead-letter selection, as a page's query string, a form or an API body.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub(super) struct DeadQuery {
    /// One dead letter, by its id.
    #[serde(skip_serializing_if = "blank")]
    pub(super) event_id: Option<String>,
    #[serde(skip_serializing_if = "blank")]
    pub(super) aggregate_type: Option<String>,
    #[serde(skip_serializing_if = "blank")]
    pub(super) event_type: Option<String>,
    /// Text the last error contains, ignoring case.
    #[serde(skip_serializing_if = "blank")]
    pub(super) error: Option<String>,
    /// Died less than this long ago (`30m`, `2h`, `7d`).
    #[serde(skip_serializing_if = "blank")]
    pub(super) newer_than: Option<String>,
    /// Died more than this long ago.
    #[serde(skip_serializing_if = "blank")]
    pub(super) older_than: Option<String>,
    /// Died at or after this instant (RFC 3339).
    #[serde(skip_serializing_if = "blank")]
    pub(super) since: Option<String>,
    /// Died before this instant (RFC 3339).
    #[serde(skip_serializing_if = "blank")]
    pub(super) until: Option<String>,
    /// A subscriber's copies only.
    #[serde(skip_serializing_if = "blank")]
    pub(super) subscriber: Option<String>,
}

/// A [`DeadQuery`] read: the filter, and its time range as instants.
pub(super) struct DeadSelection {
    pub(super) filter: DeadFilter,
    pub(super) range: Range,
}

/// A time range as instants.
#[derive(Debug, Clone, Copy)]
pub(super) struct Range {
    pub(super) since: Option<DateTime<Utc>>,
    pub(super) until: Option<DateTime<Utc>>,
}

impl DeadQuery {
    /// The selection, its ages taken from `now`.
    pub(super) fn select(&self, now: DateTime<Utc>) -> Result<DeadSelection, Problem> {
        let range = Range::read(
            now,
            [
                (&self.since, &self.newer_than, "newer_than"),
                (&self.until, &self.older_than, "older_than"),
            ],
        )?;
        let mut filter = match given(&self.event_id) {
            Some(id) => DeadFilter::event(event_id(id)?),
            None => DeadFilter::all(),
        };
        if let Some(aggregate_type) = given(&self.aggregate_type) {
            filter = filter.aggregate_type(aggregate_type);
        }
        if let Some(event_type) = given(&self.event_type) {
            filter = filter.event_type(event_type);
        }
        if let Some(error) = given(&self.error) {
            filter = filter.error_contains(error);
        }
        if let Some(since) = range.since {
            filter = filter.dead_after(since);
        }
        if let Some(until) = range.until {
            filter = filter.dead_before(until);
        }
        if let Some(subscriber) = given(&self.subscriber) {
            filter = filter.subscriber(subscriber);
        }
        Ok(DeadSelection { filter, range })
    }

    /// The same selection with its range as instants, ending at `now` if it had no end: what a
    /// confirmation page hands on to the action.
    pub(super) fn pinned(&self, range: Range, now: DateTime<Utc>) -> DeadQuery {
        DeadQuery {
            newer_than: None,
            older_than: None,
            since: range.since.map(|at| at.to_rfc3339()),
            until: Some(range.until.unwrap_or(now).to_rfc3339()),
            ..self.clone()
        }
    }

    /// Whether nothing narrows the selection.
    pub(super) fn is_everything(&self) -> bool {
        self.fields().is_empty()
    }

    /// The query string that selects the same (`aggregate_type=...&...`).
    pub(super) fn query_string(&self) -> String {
        serde_urlencoded::to_string(self).unwrap_or_default()
    }

    /// The fields and their values, for a form's hidden inputs.
    pub(super) fn fields(&self) -> Vec<(&'static str, &str)> {
        let fields = [
            ("event_id", &self.event_id),
            ("aggregate_type", &self.aggregate_type),
            ("event_type", &self.event_type),
            ("error", &self.error),
            ("newer_than", &self.newer_than),
            ("older_than", &self.older_than),
            ("since", &self.since),
            ("until", &self.until),
            ("subscriber", &self.subscriber),
        ];
        fields.into_iter().filter_map(|(name, value)| Some((name, given(value)?))).collect()
    }
}

/// A replay's selection: one type, published in a time range with a start.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct ReplayQuery {
    pub(super) aggregate_type: Option<String>,
    pub(super) event_type: Option<String>,
    pub(super) newer_than: Option<String>,
    pub(super) older_than: Option<String>,
    pub(super) since: Option<String>,
    pub(super) until: Option<String>,
}

/// A [`ReplayQuery`] read.
pub(super) struct ReplaySelection {
    pub(super) aggregate_type: String,
    pub(super) event_type: String,
    pub(super) since: DateTime<Utc>,
    pub(super) until: DateTime<Utc>,
}

impl ReplayQuery {
    /// The selection, its ages taken from `now`; a range without an end ends at `now`.
    pub(super) fn select(&self, now: DateTime<Utc>) -> Result<ReplaySelection, Problem> {
        let (Some(aggregate_type), Some(event_type)) =
            (given(&self.aggregate_type), given(&self.event_type))
        else {
            return Err(Problem::BadInput(
                "name the aggregate type and the event type to replay".into(),
            ));
        };
        let (aggregate_type, event_type) = (aggregate_type.to_owned(), event_type.to_owned());
        let range = Range::read(
            now,
            [
                (&self.since, &self.newer_than, "newer_than"),
                (&self.until, &self.older_than, "older_than"),
            ],
        )?;
        let Some(since) = range.since else {
            return Err(Problem::BadInput(
                "say how far back to replay: newer_than, such as 1h or 2d".into(),
            ));
        };
        Ok(ReplaySelection { aggregate_type, event_type, since, until: range.until.unwrap_or(now) })
    }
}

impl Range {
    /// `[start, end]`, each an instant or an age before `now`; refuses a range with nothing
    /// in it.
    fn read(now: DateTime<Utc>, [start, end]: [Bound<'_>; 2]) -> Result<Range, Problem> {
        let range = Range { since: instant(now, start)?, until: instant(now, end)? };
        if let (Some(since), Some(until)) = (range.since, range.until) {
            if since >= until {
                return Err(Problem::BadInput(format!(
                    "the time range is empty: it starts at {since} and ends at {until}; make \
                     older_than shorter than newer_than"
                )));
            }
        }
        Ok(range)
    }
}

/// One end of a range: an instant, else an age, and the age's field name for messages.
type Bound<'a> = (&'a Option<String>, &'a Option<String>, &'static str);

fn instant(
    now: DateTime<Utc>,
    (at, age, name): Bound<'_>,
) -> Result<Option<DateTime<Utc>>, Problem> {
    if let Some(at) = given(at) {
        let at = DateTime::parse_from_rfc3339(at).map_err(|error| {
            Problem::BadInput(format!(
                "`{at}` is not an RFC 3339 instant ({error}); reload the page"
            ))
        })?;
        return Ok(Some(at.with_timezone(&Utc)));
    }
    let Some(age) = given(age) else { return Ok(None) };
    let parsed = humantime::parse_duration(age).map_err(|error| {
        Problem::BadInput(format!(
            "{name} `{age}` is not an age ({error}): write it as 30m, 2h or 7d"
        ))
    })?;
    let too_long = || {
        Problem::BadInput(format!(
            "{name} `{age}` reaches back before any event: give an age of at most a few years, \
             or leave it empty for no bound"
        ))
    };
    let parsed = chrono::Duration::from_std(parsed).map_err(|_| too_long())?;
    now.checked_sub_signed(parsed).map(Some).ok_or_else(too_long)
}

/// An event id from a form, a path or a query string.
pub(super) fn event_id(id: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(id.trim()).map_err(|error| {
        Problem::BadInput(format!(
            "`{id}` is not an event id ({error}): paste it as logged, 36 characters such as \
             0193b1de-8f0a-7c3e-9a51-2b6f4d7e1c20"
        ))
    })
}

/// An event type named by a form or an API body.
#[derive(Debug, Deserialize)]
pub(super) struct TypeForm {
    pub(super) aggregate_type: String,
    pub(super) event_type: String,
    #[serde(default)]
    pub(super) reason: Option<String>,
}

impl TypeForm {
    /// `(aggregate_type, event_type)`, refusing a blank one.
    pub(super) fn named(&self) -> Result<(&str, &str), Problem> {
        match (self.aggregate_type.trim(), self.event_type.trim()) {
            ("", _) | (_, "") => {
                Err(Problem::BadInput("name both the aggregate type and the event type".into()))
            }
            named => Ok(named),
        }
    }
}

/// A page of dead letters: a selection and where the page starts.
#[derive(Deserialize)]
pub(super) struct DeadPage {
    #[serde(flatten)]
    pub(super) query: DeadQuery,
    pub(super) after: Option<String>,
}

/// Dead letters per page, of the pages and the API.
pub(super) const DEAD_PAGE_SIZE: u32 = 50;

/// A page of dead letters as read.
pub(super) struct DeadLetters {
    /// How many match the selection.
    pub(super) matching: u64,
    /// Up to [`DEAD_PAGE_SIZE`] of them.
    pub(super) events: Vec<crate::dead_letters::DeadEvent>,
    /// The next page: the selection with its range pinned (so it continues the same list), and
    /// the id it starts after; `None` on the last page.
    pub(super) next: Option<(DeadQuery, Uuid)>,
}

impl DeadPage {
    /// The page the query names, its selection's ages taken from `now`.
    pub(super) async fn read(
        &self,
        pool: &sqlx::PgPool,
        now: DateTime<Utc>,
    ) -> Result<DeadLetters, Problem> {
        let selection = self.query.select(now)?;
        let after = given(&self.after).map(event_id).transpose()?;
        let filter = &selection.filter;
        let (matching, mut events) = tokio::try_join!(
            crate::dead_letters::count(pool, filter),
            crate::dead_letters::list(pool, filter, after, DEAD_PAGE_SIZE + 1),
        )?;
        let more = events.len() > DEAD_PAGE_SIZE as usize;
        events.truncate(DEAD_PAGE_SIZE as usize);
        let next = match (more, events.last()) {
            (true, Some(last)) => Some((self.query.pinned(selection.range, now), last.event_id)),
            _ => None,
        };
        Ok(DeadLetters { matching, events, next })
    }
}

/// An aggregate named by the events page or the API.
#[derive(Deserialize)]
pub(super) struct AggregateQuery {
    pub(super) aggregate_type: String,
    pub(super) aggregate_id: String,
}

/// Events listed of an aggregate.
pub(super) const AGGREGATE_PAGE_SIZE: u32 = 200;

/// A form field's text, unless it was left empty.
pub(super) fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|text| !text.is_empty())
}

fn blank(field: &Option<String>) -> bool {
    given(field).is_none()
}

//! Reading a statement's plan: what tests/plans.rs and tests/console_plans.rs check of every
//! statement, prepared on an empty outbox and run on a big one.

use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// Rows read by every scan of a JSON plan (returned, or read and filtered out), times loops.
pub fn rows_read(node: &serde_json::Value) -> i64 {
    let kind = node["Node Type"].as_str().unwrap_or_default();
    let own = if kind.contains("Scan") && kind != "CTE Scan" && kind != "Function Scan" {
        let loops = node["Actual Loops"].as_i64().unwrap_or(1);
        let rows = node["Actual Rows"].as_i64().unwrap_or(0)
            + node["Rows Removed by Filter"].as_i64().unwrap_or(0)
            + node["Rows Removed by Index Recheck"].as_i64().unwrap_or(0);
        rows * loops
    } else {
        0
    };
    own + node["Plans"].as_array().map_or(0, |children| children.iter().map(rows_read).sum())
}

/// Rows a statement returned, or for a modification without `RETURNING`, modified.
pub fn touched(root: &serde_json::Value) -> i64 {
    let returned = root["Actual Rows"].as_i64().unwrap_or(0);
    if root["Node Type"] != "ModifyTable" || returned > 0 {
        return returned;
    }
    let children = root["Plans"].as_array().into_iter().flatten();
    children
        .filter(|child| child["Parent Relationship"] == "Outer")
        .map(|child| child["Actual Rows"].as_i64().unwrap_or(0))
        .sum()
}

/// Whether any node of a JSON plan is a sequential scan.
pub fn has_seq_scan(node: &serde_json::Value) -> bool {
    node["Node Type"] == "Seq Scan"
        || node["Plans"].as_array().is_some_and(|children| children.iter().any(has_seq_scan))
}

/// One statement: its name, SQL, parameter types, and the rows it should touch.
pub struct Statement {
    pub name: &'static str,
    pub sql: &'static str,
    pub parameters: &'static str,
    /// Arguments for the run on the empty outbox, and for the measured run.
    pub first: String,
    pub measured: String,
    pub touches: i64,
    /// Run inside a transaction that first sets this (as `publish_in` does).
    pub local: Option<&'static str>,
}

/// A Postgres array literal of uuids.
pub fn uuids(ids: &[Uuid]) -> String {
    let items: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    format!("'{{{}}}'", items.join(","))
}

pub async fn explain(conn: &mut PgConnection, statement: &Statement) -> serde_json::Value {
    let mut tx = conn.begin().await.unwrap();
    if let Some(setting) = statement.local {
        sqlx::raw_sql(setting).execute(&mut *tx).await.unwrap();
    }
    let arguments = match statement.measured.as_str() {
        "" => String::new(),
        measured => format!("({measured})"),
    };
    let sql = format!("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {}{arguments}", statement.name);
    let plan: serde_json::Value =
        sqlx::query_scalar(sqlx::static_sql(sql)).fetch_one(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    plan
}

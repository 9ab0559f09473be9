//! The inbox suites' common ground: the `effects` table the consumer processes write to, one
//! row per handler call that committed, and what it says.

use sqlx::PgPool;

/// Creates `effects (event_id, pid)`, which the `inbox-process*` binaries' handlers write to.
pub async fn create_effects(pool: &PgPool) {
    sqlx::query("CREATE TABLE effects (event_id uuid NOT NULL, pid int NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// `(effects, distinct events with an effect, events with more than one)`.
pub async fn effects(pool: &PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*), count(DISTINCT event_id), \
                (SELECT count(*) FROM (SELECT 1 FROM effects GROUP BY event_id HAVING count(*) > 1) d) \
         FROM effects",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

// Only async functions and closures are handlers.
use outbox_runtime::Relay;

fn main() {
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost").unwrap();
    let _ = Relay::builder(pool).handler("order.placed").build();
}

//! Databases of the other backends for a test of their own: a SQLite file in the temporary
//! directory, a MySQL or MariaDB database on the server at `MYSQL_URL` (the local MariaDB,
//! `mysql://root@127.0.0.1:3306`, when unset). Each is dropped with its guard.

use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use uuid::Uuid;

/// A SQLite database file of the test's own, removed on drop.
pub struct SqliteFile {
    pub path: std::path::PathBuf,
}

impl SqliteFile {
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(format!("outbox-test-{}.db", Uuid::new_v4()));
        SqliteFile { path }
    }

    /// A pool on the file, created if missing.
    pub async fn pool(&self) -> SqlitePool {
        let options = SqliteConnectOptions::new().filename(&self.path).create_if_missing(true);
        SqlitePoolOptions::new().max_connections(4).connect_with(options).await.unwrap()
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-journal", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

/// The MySQL or MariaDB server the tests use.
pub fn mysql_server() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned())
}

/// A database of the test's own on the MySQL server; [`MySqlDatabase::drop_it`] removes it.
pub struct MySqlDatabase {
    pub name: String,
    pub url: String,
}

impl MySqlDatabase {
    pub async fn create() -> Self {
        let name = format!("outbox_test_{}", Uuid::new_v4().simple());
        let server = mysql_server();
        let admin = MySqlPoolOptions::new().max_connections(1).connect(&server).await.unwrap();
        let create = sqlx::static_sql(format!("CREATE DATABASE {name}"));
        sqlx::query(create).execute(&admin).await.unwrap();
        admin.close().await;
        MySqlDatabase { url: format!("{server}/{name}"), name }
    }

    /// A pool on the database.
    pub async fn pool(&self) -> MySqlPool {
        MySqlPoolOptions::new().max_connections(4).connect(&self.url).await.unwrap()
    }

    /// Drops the database (tests call it at their end; a failed test leaves it, named
    /// `outbox_test_*`, for a look).
    pub async fn drop_it(self) {
        let admin =
            MySqlPoolOptions::new().max_connections(1).connect(&mysql_server()).await.unwrap();
        let drop = sqlx::static_sql(format!("DROP DATABASE {}", self.name));
        sqlx::query(drop).execute(&admin).await.unwrap();
        admin.close().await;
    }
}

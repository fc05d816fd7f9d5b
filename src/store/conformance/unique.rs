//! The probes every unique-violation classifier is tested with against a real engine:
//! a table with a primary key, a `UNIQUE` column, a `NOT NULL` one, a `CHECK` and a
//! foreign key, and one statement breaking each (only the first two are "that row
//! already exists"). For a classifier of your own, or another driver's.

pub use super::service_url;

/// A table name of this process's own, so concurrent runs never meet.
pub fn table() -> String {
    format!("idemcache_unique_{}", std::process::id())
}

/// The statements `table` is probed with: (SQL, whether it is a unique violation).
pub fn probes(table: &str) -> Vec<(String, bool)> {
    vec![
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (2, 'a', 'x', 1, 1)"), true),
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (1, 'b', 'x', 1, 1)"), true),
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (3, 'c', NULL, 1, 1)"), false),
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (4, 'd', 'x', 0, 1)"), false),
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (5, 'e', 'x', 1, 99)"), false),
        (format!("INSERT INTO {table}_nowhere VALUES (1)"), false),
    ]
}

/// The statements creating `table` (and its parent) afresh, with `engine` appended to
/// each `CREATE TABLE` (e.g. `" ENGINE=InnoDB"`, the MySQL engine that checks foreign
/// keys), and its first row.
pub fn schema(table: &str, engine: &str) -> Vec<String> {
    vec![
        format!("DROP TABLE IF EXISTS {table}"),
        format!("DROP TABLE IF EXISTS {table}_parent"),
        format!("CREATE TABLE {table}_parent (id INT PRIMARY KEY){engine}"),
        format!("INSERT INTO {table}_parent VALUES (1)"),
        format!(
            "CREATE TABLE {table} (id INT PRIMARY KEY, u VARCHAR(10) UNIQUE, n VARCHAR(10) NOT NULL, \
             c INT CHECK (c > 0), p INT REFERENCES {table}_parent (id)){engine}"
        ),
        format!("INSERT INTO {table} (id, u, n, c, p) VALUES (1, 'a', 'x', 1, 1)"),
    ]
}

/// The statements dropping what [`schema`] made.
pub fn cleanup(table: &str) -> Vec<String> {
    vec![format!("DROP TABLE {table}"), format!("DROP TABLE {table}_parent")]
}

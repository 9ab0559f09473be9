//! Writes the JSON Schema of each of the quickstart's events to a folder, one file per event
//! type and version (`order.placed.v1.schema.json`), for consumers in other languages to generate
//! their types from.
//!
//! Run with `cargo run --example event_schemas [FOLDER]` (default `target/event-schemas`).

mod shop;

use std::path::PathBuf;

use outbox_runtime::{event_schemas, EventSchema};
use shop::{OrderCancelled, OrderPlaced};

fn main() -> std::io::Result<()> {
    let folder =
        std::env::args_os().nth(1).map_or_else(|| "target/event-schemas".into(), PathBuf::from);
    std::fs::create_dir_all(&folder)?;
    let schemas: Vec<EventSchema> =
        [event_schemas::<OrderPlaced>(), event_schemas::<OrderCancelled>()].concat();
    for schema in schemas {
        let path = folder.join(schema.file_name());
        std::fs::write(&path, serde_json::to_string_pretty(&schema.schema)? + "\n")?;
        println!("{}", path.display());
    }
    Ok(())
}

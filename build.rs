//! Rebuild when a migration changes: `sqlx::migrate!` embeds the files at
//! compile time and does not track them itself.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

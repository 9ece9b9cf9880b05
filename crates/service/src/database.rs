//! The database a service runs on, opened and migrated: the one handle to the store that leaves this crate,
//! opaque, so the server can open it once (and `jointspace export` read it alone) without seeing the store.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;

use crate::store::{self, Store, StoreError};

pub struct Database(pub(crate) Store);

impl Database {
    /// Connects and migrates, with advice in the error when the database cannot be opened; at most
    /// `connections` to Postgres.
    pub async fn open(url: &str, timeout: Duration, connections: u32) -> anyhow::Result<Database> {
        let shown = store::redacted_url(url);
        match Store::connect_with(url, timeout, connections).await {
            Ok(s) => Ok(Database(s)),
            Err(e @ StoreError::Tls(_)) => Err(anyhow::Error::new(e).context(format!(
                "cannot open the database {shown}: with sslmode=verify-ca or verify-full, sslrootcert must name \
                 the PEM file of the CA that signed the server's certificate, and verify-full also needs the \
                 host in the URL to be one the certificate names"
            ))),
            Err(e) => Err(e).with_context(|| format!("cannot open the database {shown}")),
        }
    }

    /// The file of a SQLite URL (none for Postgres or an in-memory database).
    pub fn file_path(url: &str) -> Option<PathBuf> {
        Store::file_path(url)
    }

    /// Checkpoints SQLite's WAL into the file and closes the pool.
    pub async fn close(self) {
        self.0.close().await;
    }
}

//! `jointspace export`: a collection as JSON lines, to a file or standard output. It reads the database
//! alone: no model is loaded and no index built.

use anyhow::Context;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::{
    app::open_database,
    config::ExportArgs,
    service::{CollectionName, export_collection},
};

pub async fn export(args: ExportArgs) -> anyhow::Result<()> {
    let collection = CollectionName::parse(&args.collection)?;
    let db = open_database(&args.store).await?;
    let mut lines = Box::pin(export_collection(&db, &collection).await?);
    let mut out: Box<dyn tokio::io::AsyncWrite + Unpin> = match &args.out {
        Some(p) => Box::new(
            tokio::fs::File::create(p)
                .await
                .with_context(|| format!("cannot create {}", p.display()))?,
        ),
        None => Box::new(tokio::io::stdout()),
    };
    while let Some(chunk) = lines.next().await {
        out.write_all(&chunk?).await.context("writing the export")?;
    }
    out.flush().await?;
    drop(lines);
    db.close().await;
    Ok(())
}

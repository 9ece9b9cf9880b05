//! `jointspace reindex`: every stored vector recomputed under the loaded bundle (images from their codes).

use std::sync::Arc;

use super::offline_pipeline;
use crate::{
    app::{Purpose, open_service},
    config::ReindexArgs,
    metrics::Metrics,
};

pub async fn reindex(args: ReindexArgs) -> anyhow::Result<()> {
    let pipeline = offline_pipeline(&args.model)?;
    let svc = open_service(
        pipeline,
        &args.store,
        Arc::new(Metrics::new()),
        None,
        Purpose::Search,
    )
    .await?;
    let r = svc.reindex(args.page_rows).await?;
    svc.snapshot().await?;
    svc.close().await;
    println!(
        "reindexed {} images (from their stored codes) and {} captions; {} rows reused from an interrupted reindex",
        r.images, r.captions, r.resumed
    );
    Ok(())
}

// Names for the API's shapes, taken from the types generated from openapi.yaml (src/schema.ts), so that a
// change to the contract shows up here as a type error. What the client takes differs from the wire only
// where a photo is concerned (an ImageInput instead of base64).

import type { components } from "./schema.js";
import type { ImageInput } from "./images.js";

type S = components["schemas"];

export type AddedCaptions = S["AddedCaptions"];
export type AddedImage = S["AddedImage"];
export type AddedImages = S["AddedImages"];
export type BundleInfo = S["BundleInfo"];
export type Caption = S["Caption"];
export type CaptionList = S["CaptionList"];
export type CaptionResult = S["CaptionResult"];
export type CaptionResults = S["CaptionResults"];
export type Collection = S["Collection"];
export type CreateCollection = S["CreateCollection"];
export type EmbedImageResponse = S["EmbedImageResponse"];
export type EmbedTextResponse = S["EmbedTextResponse"];
export type ErrorBody = S["ErrorBody"];
export type Health = S["Health"];
export type Image = S["Image"];
export type ImageList = S["ImageList"];
export type ImagePatch = S["ImagePatchJson"];
export type ImageResult = S["ImageResult"];
export type ImageResults = S["ImageResults"];
export type ItemError = S["ItemError"];
export type Mode = S["Mode"];
export type TextField = S["TextField"];
export type WeightedTextField = S["WeightedTextField"];
export type NewCaption = S["NewCaption"];
export type Outcome = S["Outcome"];
export type Readiness = S["Readiness"];
export type ReindexReport = S["ReindexReport"];
export type SnapshotReport = S["SnapshotReport"];
export type SyncJob = S["SyncJob"];
export type SyncReport = S["SyncReport"];
export type UpsertedImage = S["UpsertedImage"];

/** A catalogue feed to sync: its text or its URL, and the sync's options (the query of POST .../sync). */
export interface SyncFeed {
  text?: string;
  url?: string;
  format?: "csv" | "jsonl";
  dryRun?: boolean;
  maxDeleteShare?: number;
  skipFailed?: boolean;
  idField?: string;
  imageField?: string;
  captionsField?: string;
  captionFields?: string[];
  numberFields?: string[];
}

/** A metadata object or a filter: any JSON object. */
export type JsonObject = Record<string, unknown>;

/** An image to add: the photo (bytes, a Blob, base64 or a web address) and what describes it. */
export interface NewImage extends Omit<S["NewImageJson"], "data" | "url"> {
  image: ImageInput;
}

/** An image as an upsert sends it: the photo whole, its metadata and captions (absent: none). */
export interface UpsertImage extends Omit<S["UpsertImageJson"], "data"> {
  image: ImageInput;
}

/**
 * A search: exactly one of `text`, `image` (the photo itself) and `image_id` (a stored image), with the
 * request's other fields as the API names them (`k`, `offset`, `filter`, `mode`, `keyword_weight`, `min_score`).
 */
export interface SearchQuery extends Omit<S["SearchRequest"], "image"> {
  image?: ImageInput | null;
}

/** One line of an export (docs/api.md, "Export and import"): exactly one key names its kind. */
export type ExportLine =
  | { header: ExportHeader }
  | { image: ExportImage }
  | { caption: { text: string } }
  | { end: { images: number; captions: number } };

export interface ExportHeader {
  format: "jointspace-export";
  version: number;
  collection: string;
  description: string;
  exported_at: string;
  [key: string]: unknown;
}

export interface ExportImage {
  external_id?: string | null;
  metadata: JsonObject;
  width: number;
  height: number;
  /** The packed ternary code, base64. */
  code: string;
  vision_id: string;
  bundle_id: string;
  content_hash: string;
  created_at: string;
  /** The thumbnail JPEG, base64, when the image has one. */
  thumbnail?: string | null;
  captions: string[];
  [key: string]: unknown;
}

export { JointspaceClient, newIdempotencyKey, parseRetryAfter } from "./client.js";
export type {
  CallOptions,
  ClientOptions,
  ImportOptions,
  ImportResult,
  IterOptions,
  ListCaptionsOptions,
  ListImagesOptions,
  PageOptions,
  RetryInfo,
  RetryOptions,
  WriteOptions,
} from "./client.js";
export * from "./errors.js";
export { bytesToBase64, type ImageInput, type ImageSource } from "./images.js";
export type * from "./types.js";
/** The types generated from openapi.yaml, whole: `paths`, `components`, `operations`. */
export type { components, operations, paths } from "./schema.js";

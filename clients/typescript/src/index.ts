export * from "./audit.js";
export * from "./client.js";
export * from "./errors.js";
export type { JsonValue, components, operations, paths } from "./schema.js";

"use strict";
// Swagger UI as FastAPI configures it, from a file rather than an inline script (the page's
// Content-Security-Policy allows scripts of this origin only). No validator badge: it would
// fetch from another origin. The document's URL is relative, so a proxy's path prefix holds.
window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});

// Starts Swagger UI on /docs (a file of its own: the page allows no inline script).
window.addEventListener("DOMContentLoaded", function () {
  window.ui = SwaggerUIBundle({
    url: document.body.dataset.openapi || "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
  });
});

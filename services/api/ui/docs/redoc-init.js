// ReDoc for /redoc, from the copy the API serves itself (no CDN, no web fonts).
Redoc.init("/openapi.json", { hideDownloadButton: false }, document.getElementById("redoc"));

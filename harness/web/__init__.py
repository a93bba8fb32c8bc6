"""The HTTP side: a JSON API over the read service and the operator actions,
and the run dashboard, served by one ASGI app (``harness serve``).

    app.py       the FastAPI application: routes, and errors as JSON
    auth.py      the bearer token, the dashboard's login cookie, the CSRF guard
    door.py      the middleware that checks the token and meters the body before the app
    schemas.py   request bodies and response shapes (the OpenAPI document)
    server.py    ``harness serve``: the token, the login URL, uvicorn
    static/      the dashboard's pages, plain JavaScript with no CDN
"""

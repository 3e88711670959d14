"""The run as a Flower app: the project's coordinator in a ServerApp (``flower/server_app.py``), each site's
client session in a ClientApp (``flower/client_app.py``), their calls carried as Flower messages
(``flower/records.py``). Nothing else in the project imports this package (``pip install .[flower]``)."""

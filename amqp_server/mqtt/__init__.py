"""The MQTT 3.1/3.1.1 front end (docs/mqtt.md)."""

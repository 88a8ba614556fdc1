# Placeholder image (the real multi-stage CUDA/CPU image comes with the Helm chart issue).
FROM python:3.11-slim
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu && pip install --no-cache-dir .
USER 65532:65532
ENTRYPOINT ["folio"]
